"""`plan(spec, node) -> Plan`: the one place a run's shape becomes ranks and environments.

spec -> layout -> backend -> framework checks -> fabric per node -> every rank's environment.
The run, the panel's preview, the sidebar, `%dist export` and `%dist doctor` all call it; none
builds a layout of its own. Pure: no process starts, nothing is read but its arguments.

Ports: before engines run, a run has no master port yet. `Ports.unchosen` stands in with
torchrun's defaults (what an exported job uses too); the run replaces them with the engines'
real ports once they are up (`plan(..., ports=Ports(cluster.master_port, cluster.task_ports))`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field

from IPython.core.error import UsageError

from jupyter_dist import frameworks
from jupyter_dist.common.node import NodeFabric
from jupyter_dist.frameworks import Framework, RunContext
from jupyter_dist.plan.envs import rank_environments
from jupyter_dist.plan.fabric_env import fabric_env, resolve_backend
from jupyter_dist.plan.layout import Layout, build_layout
from jupyter_dist.plan.spec import RunSpec

TORCHRUN_MASTER_PORT = 29500  # torchrun's own default master port


@dataclass(frozen=True)
class Ports:
    """Where a run's servers listen: the master (torch store, rendezvous) and one port per task."""

    master: int
    tasks: tuple[int, ...] = ()
    chosen: bool = True  # False: stand-ins until engines run (shown as such by the panel)

    @classmethod
    def unchosen(cls, spec: RunSpec, task_limit: int | None = None) -> Ports:
        """torchrun's defaults (29500, then one port per rank above it), or the user's --master-port."""
        master = spec.master_port or TORCHRUN_MASTER_PORT
        world = spec.world_size
        tasks = tuple(master + 1 + r for r in range(world)) if task_limit is None or world <= task_limit else ()
        return cls(master, tasks, chosen=spec.master_port is not None)


@dataclass(frozen=True)
class Plan:
    """Everything a run needs to know before it sends a cell: checked, per rank."""

    spec: RunSpec
    framework: Framework
    layout: Layout
    backend: str
    ports: Ports
    envs: dict[int, dict[str, str]] = field(default_factory=dict)  # empty above `env_limit` ranks
    notes: tuple[str, ...] = ()  # one-line notes for the user (the backend `auto` chose, ...)
    before_start: tuple[str, ...] = ()  # the framework's notes, said before anything starts

    @property
    def context(self) -> RunContext:
        return RunContext(self.spec, self.layout, self.backend)


def layout_of(spec: RunSpec, ports: Ports | None = None, addrs: Sequence[str] = ()) -> Layout:
    """The run's layout: `addrs` are the nodes' addresses as the engines found them (other hosts),
    else the spec's hosts (this host when none)."""
    ports = ports or Ports.unchosen(spec)
    hosts = tuple(addrs) or spec.hosts
    return build_layout(spec.nodes, spec.procs_per_node, hosts, master_port=ports.master, task_ports=ports.tasks)


def plan(
    spec: RunSpec,
    node: NodeFabric | Sequence[NodeFabric],
    *,
    ports: Ports | None = None,
    addrs: Sequence[str] = (),
    inherited: frozenset[str] = frozenset(),
    env_limit: int | None = None,
) -> Plan:
    """Check the run and compute its environments; raises `UsageError` (one sentence naming the flag).

    `node` is this host's fabric (every node alike) or one per node (engines on other hosts).
    `env_limit`: above this many ranks the environments are not computed (a preview's bound).
    """
    fw = frameworks.get(spec.framework)
    ports = ports or Ports.unchosen(spec, task_limit=env_limit)
    layout = layout_of(spec, ports, addrs)
    nodes = tuple(node) if isinstance(node, Sequence) else (node,) * layout.nodes
    if len(nodes) != layout.nodes:
        raise ValueError(f"{len(nodes)} node fabrics for {layout.nodes} nodes")
    backend, note = resolve_backend(spec.backend, nodes[0].gpu_count, spec.procs_per_node)
    notes = (note,) if note else ()
    ctx = RunContext(spec, layout, backend, inherited=inherited)
    fw.check(ctx)
    before_start = fw.before_start(ctx)
    all_local = layout.all_local  # a property that reads every host: once, not once per node
    fabric = {
        n: fabric_env(nodes[n], backend=backend, ib=spec.ib, nccl_debug=spec.nccl_debug,
                      master_addr=layout.master_addr, all_local=all_local)
        for n in range(layout.nodes)
    }
    envs: dict[int, dict[str, str]] = {}
    if env_limit is None or layout.world_size <= env_limit:
        envs = rank_environments(ctx, fw, fabric)
    return Plan(spec, fw, layout, backend, ports, envs, notes, before_start)


def install_problem(fw: Framework) -> str | None:
    """The sentence a run fails with when the framework's module is not installed here, else None."""
    if fw.module and importlib.util.find_spec(fw.module) is None:
        return f"-f {fw.name} needs {fw.module}, which is not installed here: {fw.install_hint()}"
    return None


def check_plan(spec: RunSpec, node: NodeFabric) -> Plan:
    """`plan` with the installation check first, as a run makes it before anything starts."""
    fw = frameworks.get(spec.framework)
    if problem := install_problem(fw):
        raise UsageError(f"{problem}.")
    return plan(spec, node)
