"""`DistSession`: one kernel's jupyter-dist state, and the flow of a run.

flags -> RunSpec -> plan (checks) -> EngineCluster -> plan on the engines (ports, rank
environments) -> Runner -> sinks. Everything before `cluster.ensure` is checked first, so bad
input never touches the warm cluster. The sinks and the charts are views, handed in.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from IPython.core.error import UsageError

from jupyter_dist import frameworks
from jupyter_dist.cluster import stopping
from jupyter_dist.cluster.engines import EngineCluster, check_shape
from jupyter_dist.cluster.preload import modules_for
from jupyter_dist.cluster.shape import ClusterShape
from jupyter_dist.common.ports import port_in_use
from jupyter_dist.engine.entry import ENTRY, call_code
from jupyter_dist.engine.metrics_hooks import install as install_metrics
from jupyter_dist.engine.node_probe import detect_node, find_mpiexec
from jupyter_dist.engine.torch_hooks import cuda_set_device
from jupyter_dist.errors import OutputFetchError
from jupyter_dist.frameworks import Framework, RunContext
from jupyter_dist.plan.defaults import STORE, DefaultsStore
from jupyter_dist.plan.layout import Layout
from jupyter_dist.plan.plan import Plan, Ports, install_problem, layout_of, plan
from jupyter_dist.plan.spec import RunSpec, remembered
from jupyter_dist.run.cell_check import check_compiles
from jupyter_dist.run.display import PlainDisplay, RunDisplay
from jupyter_dist.run.metrics_store import ScalingPoint, scaling_result, scaling_shape
from jupyter_dist.run.output import OutputSink, TextSink
from jupyter_dist.run.rank_report import RankReports
from jupyter_dist.run.resources import ResourcePoller, ResourceStore
from jupyter_dist.run.runner import Execution, Runner, RunOutcome


@dataclass
class LastRun:
    spec: RunSpec
    code: str | None  # the cell, or None in script mode


@dataclass
class Prepared:
    """A checked run: its plan (stand-in ports and no environments until `bring_up` plans it on the
    engines), the notes still to say, the set-up hooks every engine runs."""

    spec: RunSpec
    plan: Plan
    notes: list[str]
    hooks: tuple[Callable[[], None], ...] = ()  # engine functions (compared by identity)

    @property
    def framework(self) -> Framework:
        return self.plan.framework

    @property
    def backend(self) -> str:
        return self.plan.backend

    @property
    def layout(self) -> Layout:
        return self.plan.layout

    @property
    def envs(self) -> dict[int, dict[str, str]]:
        return self.plan.envs


def say(text: str) -> None:
    print(f"jupyter-dist: {text}", flush=True)


def not_warm_note(framework: str) -> str:
    """Said once per session before the first run of a framework whose workers are new processes."""
    return (f"-f {framework} starts new worker processes on every run: variables the cell "
            "defines do not survive it (use -f pytorch to keep state on warm engines).")


_NODE_LOCK = threading.Lock()


@dataclass
class DistSession:
    """`sink_factory` makes each run's output sink and `display` shows charts and start-up progress:
    both are views, handed in by `jupyter_dist.get_session()` (plain text when none are)."""

    store: DefaultsStore = field(default_factory=lambda: STORE)
    cluster: EngineCluster = field(default_factory=EngineCluster)
    sink_factory: Callable[[], OutputSink] = TextSink
    display: RunDisplay = field(default_factory=PlainDisplay)
    last: LastRun | None = None
    last_outcome: RunOutcome | None = None
    reports: RankReports = field(default_factory=RankReports)  # stacks taken: %dist stacks shows the last
    resources: ResourceStore | None = None  # the last run's CPU, memory and GPU per rank
    _local_node: Any = None
    _mpiexec_found: bool | None = None
    _said: set[str] = field(default_factory=set)  # one-line notes already shown this session
    _plan: tuple[tuple[Any, ...], Prepared] | None = None  # the last run's plan, by what it depends on

    def __post_init__(self) -> None:
        self.runner = Runner(self.cluster, self.sink_factory)

    # -- checks (no side effects) ------------------------------------------------------

    def mpiexec_found(self) -> bool:
        """Whether an `mpiexec` is here, looked up once (the default launcher depends on it)."""
        if self._mpiexec_found is None:
            self._mpiexec_found = find_mpiexec() is not None
        return self._mpiexec_found

    def local_node(self) -> Any:
        with _NODE_LOCK:  # probed once: by %load_ext's prewarm thread (run/warm_start.py) or the first cell
            if self._local_node is None:
                self._local_node = detect_node("127.0.0.1")
        return self._local_node

    def prepare(self, spec: RunSpec, code: str | None, shell: Any = None) -> Prepared:
        """Every check that can fail before a process starts."""
        fw = frameworks.get(spec.framework)
        if problem := install_problem(fw):
            raise UsageError(f"{problem}.")
        if code is not None:
            check_compiles(code, shell)
        if spec.script is not None and not os.path.isfile(spec.script):
            raise UsageError(f"%distrun: the script {spec.script!r} does not exist.")
        # the backend, the framework's and the fabric's checks, on stand-in ports (no environments yet)
        checked = plan(spec, self.local_node(), env_limit=0)
        if spec.master_port is not None and spec.master_port != self.cluster.master_port and port_in_use(spec.master_port):
            raise UsageError(f"--master-port {spec.master_port} is already in use on this host: choose another or leave it out.")
        check_shape(self.shape_of(spec), fw.family)
        for note in checked.before_start:
            say(note)
        return Prepared(spec, checked, list(checked.notes))

    # -- the run ----------------------------------------------------------------------

    def shape_of(self, spec: RunSpec) -> ClusterShape:
        if spec.launcher == "slurm":
            return ClusterShape(spec.launcher, spec.world_size, spec.hosts, slurm_nodes=spec.nodes, slurm=spec.slurm)
        return ClusterShape(spec.launcher, spec.world_size, spec.hosts)

    def bring_up(self, p: Prepared) -> None:
        """Engines of the right shape, the layout with real ports, every rank's environment."""
        spec = p.spec
        if (p.framework.family == "mpi" or p.backend == "mpi") and (gone := stopping.settle(self.cluster, start=False)):
            # ranks killed after a --timeout: their replacements would not be in the MPI world the run needs
            say(f"rank(s) {', '.join(map(str, gone))} did not stop after the timeout and -f {p.framework.name} "
                "needs one MPI world: restarting the cluster (variables on the ranks are lost)")
            self.cluster.stop()
        self.cluster.preload = modules_for(p.framework.family)  # imported by new engines as they start
        self.cluster.ensure(self.shape_of(spec), progress=self.display.start_progress(), say=say)
        if self.cluster.mpi_world_split and (p.framework.family == "mpi" or p.backend == "mpi"):
            # a replaced rank has an MPI world of its own (cluster/replacement.py): MPI needs one world
            say(f"-f {p.framework.name} needs one MPI world, and a replaced rank is not in the others': restarting the cluster")
            self.cluster.stop()
            self.cluster.ensure(self.shape_of(spec), progress=self.display.start_progress(), say=say)
        if why := p.framework.stale_engines(self.cluster, spec, self._layout(spec), p.backend):
            say(why)
            self.cluster.stop()
            self.cluster.ensure(self.shape_of(spec), progress=self.display.start_progress(), say=say)
            # records what the new engines join
            p.framework.stale_engines(self.cluster, spec, self._layout(spec), p.backend)
        for note in self.cluster.notes:
            say(note)
        self.cluster.notes = []
        for note in p.notes:
            self._say_once(note)
        p.notes = []
        p.framework.before_layout(self.cluster, spec)
        p.plan = self._engine_plan(p)
        hooks = p.framework.engine_hooks
        if p.backend == "nccl":
            hooks = (cuda_set_device, *hooks)
        # metrics: end-of-cell flush and torch step counting on every rank (see metrics_hooks.install)
        p.hooks = (*hooks, install_metrics)
        self.runner.setup(p.envs, p.hooks, os.getcwd())

    def _say_once(self, note: str) -> None:
        """A one-line note, said once per session."""
        if note not in self._said:
            say(note)
            self._said.add(note)

    def _layout(self, spec: RunSpec) -> Layout:
        """The run's layout on the engines that are up (their ports; their addresses on other hosts)."""
        return layout_of(spec, self._ports(spec), self.cluster.node_addrs)

    def _ports(self, spec: RunSpec) -> Ports:
        return Ports(spec.master_port or self.cluster.master_port, self.cluster.task_ports)

    def _engine_plan(self, p: Prepared) -> Plan:
        """The run's plan on the engines: their ports; on other hosts each node's address as the others
        reach it and its own fabric; the environment they inherited. The backend stays the one the
        checks in `prepare` chose (this host's GPUs), and its notes were said there."""
        c = self.cluster
        nodes = c.node_fabrics if c.node_addrs else self.local_node()
        return plan(replace(p.spec, backend=p.backend), nodes, ports=self._ports(p.spec),
                    addrs=c.node_addrs, inherited=c.inherited_env)

    def _plan_key(self, spec: RunSpec) -> tuple[Any, ...]:
        """What a prepared run depends on besides the cell: the engines (their ports are chosen
        when they start, and again after a failed run) and the working directory."""
        c = self.cluster
        return (spec, c.generation, c.master_port, os.getcwd())

    def warm_plan(self, spec: RunSpec, code: str | None, shell: Any = None) -> Prepared | None:
        """The last run's checked plan when this run is the same on the same live engines: a warm
        cell re-run skips the checks and environment tables that cannot have changed (about a
        third of jupyter-dist's own time per cell). The cell and the script are still checked."""
        if self._plan is None or self._plan[0] != self._plan_key(spec) or self.cluster.pending_stop or not self.cluster.alive():
            return None
        if code is not None:
            check_compiles(code, shell)
        if spec.script is not None and not os.path.isfile(spec.script):
            raise UsageError(f"%distrun: the script {spec.script!r} does not exist.")
        p = self._plan[1]
        self.runner.setup(p.envs, p.hooks, os.getcwd())  # the same objects: compared by identity
        return p

    def _remember(self, spec: RunSpec, code: str | None) -> None:
        """The run's flags become the defaults (what the panel and sidebar show); `%dist` reads `last`."""
        self.store.update(**remembered(spec))
        self.last = LastRun(spec, code)

    def run(self, spec: RunSpec, code: str | None, shell: Any = None) -> RunOutcome:
        if spec.scaling:
            return self.run_scaling(spec, code, shell)
        if spec.fresh and self.cluster.engines:
            # the children make their own group: the engines' own (kept between warm runs) holds the port
            self.cluster.rotate_master_port()
        p = self.warm_plan(spec, code, shell)
        # a warm re-run is remembered while the ranks run it
        on_sent = (lambda: self._remember(spec, code)) if p is not None else None
        if p is None:
            self._plan = None
            p = self.prepare(spec, code, shell)
            self._remember(spec, code)
            self.bring_up(p)
            self._plan = (self._plan_key(spec), p)
        ctx = RunContext(spec, p.layout, p.backend, inherited=self.cluster.inherited_env)
        source = code if code is not None else script_code(spec)
        ex = Execution(
            code=self._cell_code(p.framework, ctx, source),
            ranks=p.framework.cell_ranks(ctx),
            layout=p.layout,
            timeout=spec.timeout,
            shown=spec.ranks,
            out=spec.out,
        )
        sink = self.runner.sink_factory()  # each rank's resources go to the sink's store while the run goes
        try:
            with ResourcePoller(self.cluster.agents, getattr(sink, "resources", None)) as poller:
                self.resources = poller.store
                outcome = self.runner.execute(ex, sink=sink, on_sent=on_sent)
        except OutputFetchError as e:
            if shell is not None:  # the ranks that could send their value still do
                shell.user_ns[spec.out] = [e.values.get(r) for r in range(p.layout.world_size)]
            raise
        self.last_outcome = outcome
        if spec.out and shell is not None:
            shell.user_ns[spec.out] = [outcome.values.get(r) for r in range(p.layout.world_size)]
        return outcome

    def _cell_code(self, fw: Framework, ctx: RunContext, source: str) -> str:
        """What the cell ranks execute; before the first run of a framework whose workers are new
        processes each run (torchrun's), a note that the cell's variables do not survive it."""
        if not fw.warm:
            self._say_once(not_warm_note(fw.name))
        return fw.cell_code(ctx, source)

    # -- --scaling --------------------------------------------------------------------

    def run_scaling(self, spec: RunSpec, code: str | None, shell: Any = None) -> RunOutcome:
        """Run the cell once per world size in `spec.scaling`, then chart throughput against ideal
        linear scaling. Each size keeps the procs per node where it divides it, else 1 node x size.
        Every size is checked before the first one starts."""
        plans = []
        for size in spec.scaling:
            nodes, procs = scaling_shape(size, spec.procs_per_node)
            if spec.hosts and nodes > len(spec.hosts):
                raise UsageError(f"--scaling {size} needs {nodes} hosts; --hosts names {len(spec.hosts)}.")
            sub = replace(spec, nodes=nodes, procs_per_node=procs, scaling=(),
                          hosts=spec.hosts[:nodes] if spec.hosts else ())
            plans.append(self.prepare(sub, code, shell))
        self._remember(spec, code)
        runs: list[tuple[ScalingPoint, Any]] = []
        outcome: RunOutcome | None = None
        try:
            for p in plans:
                sub = p.spec
                say(f"--scaling: world size {sub.world_size} ({sub.nodes} node(s) x {sub.procs_per_node})")
                self.bring_up(p)
                ctx = RunContext(sub, p.layout, p.backend, inherited=self.cluster.inherited_env)
                source = code if code is not None else script_code(sub)
                ex = Execution(code=self._cell_code(p.framework, ctx, source), ranks=p.framework.cell_ranks(ctx),
                               layout=p.layout, timeout=sub.timeout, shown=sub.ranks, out=sub.out,
                               label=f"world size {sub.world_size}")
                sink = self.sink_factory()
                if hasattr(sink, "charts"):
                    sink.charts = False  # type: ignore[attr-defined]
                outcome = self.runner.execute(ex, sink)
                store = getattr(sink, "metrics", None)
                point = ScalingPoint(sub.world_size, sub.nodes, sub.procs_per_node, 0.0, outcome.elapsed)
                runs.append((point, store))
                rate = store.total_rate() if store is not None and not store.empty else None
                what = f"{rate:,.1f} {store.unit}/s summed over ranks, " if rate else ""
                say(f"world size {sub.world_size}: {what}{outcome.elapsed:.1f} s")
        finally:
            if len(runs) > 1:
                self.display.scaling(scaling_result(runs))
        assert outcome is not None
        if spec.out and shell is not None:
            shell.user_ns[spec.out] = [outcome.values.get(r) for r in range(plans[-1].spec.world_size)]
        return outcome

    # -- %dist ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        st = self.cluster.status()
        d = self.store.value
        st["framework"] = self.last.spec.framework if self.last else d.framework
        shape = self.cluster.shape
        spec = self.last.spec if self.last else None
        st["nodes"] = spec.nodes if spec else d.nodes
        st["procs_per_node"] = spec.procs_per_node if spec else (d.procs_per_node or 2)
        if spec and shape and spec.world_size == shape.world_size:
            for r in st["ranks"]:
                r["node"], r["local_rank"] = divmod(r["rank"], spec.procs_per_node)
        return st

    def shutdown(self) -> None:
        self.cluster.stop()

    def control(self) -> SessionControl:
        return SessionControl(self)

    def default_shape(self) -> ClusterShape:
        d = self.store.value
        procs = d.procs_per_node or (self.local_node().gpu_count or 2)
        launcher = d.launcher or ("mpi" if self.mpiexec_found() else "local")
        nodes = len(d.hosts) if d.hosts else d.nodes
        return ClusterShape(launcher, nodes * procs, tuple(d.hosts))


class SessionControl:
    """Start/stop/restart and status for the panel and the sidebar (the comm's `ClusterControl`)."""

    def __init__(self, session: DistSession) -> None:
        self.session = session

    def status(self) -> dict[str, Any]:
        return self.session.status()

    def start(self) -> None:
        self.session.cluster.ensure(self.session.default_shape())

    def stop(self) -> None:
        self.session.cluster.stop()

    def restart(self) -> None:
        self.session.cluster.stop()
        self.start()

    def stacks(self) -> str:
        """What `%dist stacks` prints; safe on a kernel subshell while a cell runs (agents only)."""
        return self.session.reports.text(self.session.cluster.agents)


def script_code(spec: RunSpec) -> str:
    """Script mode: the engine expands $RANK-style arguments per rank and runs the file as __main__
    with a launcher's contract (engine.script_run); with --fresh, in a new child process."""
    path = os.path.abspath(spec.script or "")
    if spec.fresh:
        return call_code(ENTRY.run_script_mode, path, list(spec.script_args), True)
    return call_code(ENTRY.run_script_mode, path, list(spec.script_args))
