"""`EngineCluster`: the ipyparallel controller and engines behind `%%distrun`.

Started by the first run that needs it, reused while the shape (launcher, world size, hosts)
stays the same, restarted when it changes or an engine has died. What differs between
launchers (mpi, local, ssh, slurm) is the launcher's (`cluster/launchers/`); engines are mapped
to ranks as the launcher says (by the MPI rank each one reports, where there is MPI).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_dist.cluster import background, heartbeat, rank_map, replacement, stopping, watchdog
from jupyter_dist.cluster import hosts as hostmod
from jupyter_dist.cluster import preload as preloading
from jupyter_dist.cluster import zygote as forking
from jupyter_dist.cluster.agents import RankAgents
from jupyter_dist.cluster.idle import when_idle
from jupyter_dist.cluster.launch_session import in_this_session
from jupyter_dist.cluster.launchers import Launcher, launcher_for
from jupyter_dist.cluster.processes import (
    group_members,
    kill_all,
    listening_ports,
    own_groups,
    pid_alive,
    process_tree,
)
from jupyter_dist.cluster.profile import lock_down, make_profile_dir
from jupyter_dist.cluster.rank_map import EngineInfo
from jupyter_dist.cluster.shape import ClusterShape
from jupyter_dist.cluster.status import status_of
from jupyter_dist.common.hosts import is_local_host
from jupyter_dist.common.ports import free_ports


def check_shape(shape: ClusterShape, family: str = "") -> None:
    """What this version cannot start, as one sentence naming the flag (before anything starts)."""
    launcher_for(shape).check(family)


@dataclass
class EngineCluster:
    """One kernel's engines. Not thread-safe: driven from the notebook's main thread."""

    on_status: Callable[[], None] | None = None
    shape: ClusterShape | None = None
    engines: list[EngineInfo] = field(default_factory=list)  # index = rank
    master_port: int = 0
    task_ports: tuple[int, ...] = ()
    notes: list[str] = field(default_factory=list)
    applied: Any = None  # what the engines were last set up with (see Runner)
    generation: int = 0  # bumped whenever the engines start or stop: plans made for older ones are stale
    busy: bool = False
    state: str = "stopped"
    _cluster: Any = None
    _client: Any = None
    _launcher: Launcher | None = None
    _watchdog: subprocess.Popen | None = None
    _zygote: Any = None  # the engines' fork server (cluster/zygote.py), where they are forked
    inherited_env: frozenset[str] = frozenset()
    _controller_ports: tuple[int, ...] | None = None
    # engines on other hosts: each node's address (node 0's is MASTER_ADDR) and fabric, as seen there
    node_addrs: tuple[str, ...] = ()
    node_fabrics: tuple[Any, ...] = ()
    controller_ip: str = "127.0.0.1"
    agents: RankAgents = field(default_factory=RankAgents)  # each rank's agent: answers while a cell runs
    mpi_world_split: bool = False  # a rank was replaced: the engines no longer share one MPI world
    spares: Any = None  # replacement engines started, not yet given their ranks (replacement.Spares)
    pending_stop: Any = None  # ranks still stopping after a --timeout was reported (stopping.Stopping)
    preload: tuple[str, ...] = ()  # what new rank engines import in a thread as they start (cluster/preload.py)
    background: Any = None  # a start running in a thread (cluster/background.py), joined before any change
    from_background: bool = False  # the engines up were started in the background (at %load_ext)
    identified: Any = None  # engine id -> its `identify` asked as it registered (cluster/rank_map.py)

    # -- lifecycle -------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._client is not None

    @property
    def client(self) -> Any:
        if self._client is None:
            raise RuntimeError("the cluster is not running")
        return self._client

    def alive(self) -> bool:
        """All engines still registered and their processes (where local) still there."""
        if self._client is None or self.shape is None:
            return False
        try:
            ids = set(self._client.ids)
        except Exception:  # noqa: BLE001 - a broken client means a dead cluster
            return False
        if any(e.engine_id not in ids for e in self.engines):
            return False
        return all(pid_alive(e.pid) for e in self.engines if is_local_host(e.host))

    def ensure(
        self,
        shape: ClusterShape,
        progress: Callable[[int, int, float], None] | None = None,
        say: Callable[[str], None] | None = None,
    ) -> bool:
        """Start or reuse engines of `shape`; True when it (re)started them. `say` hears why."""
        background.wait(self, say)
        stopping.settle(self)  # ranks still stopping after a --timeout: stopped, or killed to be replaced
        if self.shape == shape and self.alive():
            if not self.master_port and self.node_addrs:
                self._master_port_on_node0()
            return False
        if self.shape == shape and self._client is not None and self.replace_dead(say):
            return False
        if self._client is not None:
            before = self.shape.describe() if self.shape is not None else "none"
            reason = (
                "an engine died: restarting the cluster (variables on the ranks are lost)"
                if self.shape == shape
                else f"the engines started in the background have the panel's layout ({before}); this cell asks "
                f"for {shape.describe()}: restarting them" if self.from_background
                else f"the layout changed ({before} -> {shape.describe()}): restarting the cluster"
            )
            if say is not None:
                say(reason)
            self.stop()
        self.start(shape, progress)
        return True

    def start_in_background(self, shape: ClusterShape) -> None:
        """Start engines of `shape` in a thread (`%load_ext` with `DistSettings.background_start`)."""
        background.wait(self)
        if self._client is None:
            background.start(self, shape)

    def start(self, shape: ClusterShape, progress: Callable[[int, int, float], None] | None = None) -> None:
        import ipyparallel as ipp  # heavy: only once engines are wanted

        launcher = launcher_for(shape)
        launcher.check()
        remote = launcher.remote
        controller_ip = hostmod.controller_address(shape.hosts, os.environ) if remote else "127.0.0.1"
        self.controller_ip = controller_ip
        self.state = "starting"
        self._notify()
        cluster_id = f"jd-{os.getpid()}-{secrets.token_hex(3)}"
        profile_dir = make_profile_dir(cluster_id)
        cluster = ipp.Cluster(
            profile_dir=str(profile_dir),
            cluster_id=cluster_id,
            engines=launcher.engines,
            n=shape.world_size,
            controller_ip=controller_ip,
            # one broadcast scheduler: its tree's inner links would listen on loopback
            controller_args=heartbeat.controller_args()
            + (["--IPController.broadcast_scheduler_depth=0"] if remote else []),
            log_level=40,
            shutdown_atexit=True,
        )
        self.notes = launcher.configure(cluster, profile_dir, controller_ip)
        preloading.configure(cluster, shape.launcher, remote, self.preload)
        if forking.wanted(shape.launcher, remote):  # engines forked from one process (cluster/zygote.py)
            self._zygote = forking.configure(cluster, profile_dir, self.preload)
        self.controller_ip = cluster.controller_ip  # a Slurm job's nodes reach this host elsewhere
        self._cluster = cluster
        self._launcher = launcher
        t0 = time.monotonic()
        try:
            with in_this_session():  # the ranks share the kernel's CPU share (launch_session.py)
                cluster.start_controller_sync()
                cluster.start_engines_sync(shape.world_size)
            self._write_pidfile()
            self._watchdog = watchdog.start(self._pidfile)
            client = cluster.connect_client_sync()
            self._wait_for_engines(client, shape.world_size, t0, progress)
            self._client = client
            self._map_ranks(launcher)
            if nodes := launcher.probed_nodes():
                self._probe_nodes(nodes, self.controller_ip)
            self._write_pidfile()
            lock_down(profile_dir)
        except BaseException:
            self.stop()
            raise
        self.shape = shape
        if not self.node_addrs:  # else node 0's engine chose them where they are used (_probe_nodes)
            ports = free_ports(1 + shape.world_size)
            self.master_port, self.task_ports = ports[0], ports[1:]
        self._engines_changed()
        self.state = "idle"
        self._notify()

    def _probe_nodes(self, nodes: int, controller_ip: str) -> None:
        rank_map.probe_nodes(self, nodes, controller_ip)

    def _wait_for_engines(
        self, client: Any, n: int, t0: float, progress: Callable[[int, int, float], None] | None
    ) -> None:
        rank_map.wait_for_engines(self, client, n, t0, progress)

    def _check_engines_running(self) -> None:
        es = self._engine_set()
        if es is not None and es.state == "after":
            raise RuntimeError(f"the engines exited while starting; engine log:\n{self.engine_log()[-3000:]}")

    def _engine_set(self) -> Any:
        if self._cluster is None or not self._cluster.engines:
            return None
        return next(iter(self._cluster.engines.values()))

    def engine_log(self) -> str:
        es = self._engine_set()
        if es is None:
            return ""
        try:
            return es.get_output() or ""
        except Exception:  # noqa: BLE001 - the log is only informative
            return ""

    def rotate_master_port(self) -> None:
        """A new master port for the next run. Engines on other hosts: 0 until the next run asks
        node 0 (`ensure`), where the port is used; its engine may still be busy now."""
        self.master_port = 0 if self.node_addrs else free_ports(1)[0]

    def _master_port_on_node0(self) -> None:
        """A master port free on node 0's address, asked of node 0's first engine."""
        taken = set(self.task_ports)
        got = self._client[self.engines[0].engine_id].apply_sync(free_ports, 1 + len(taken), self.node_addrs[0])
        self.master_port = next(p for p in got if p not in taken)

    def controller_ports(self) -> tuple[int, ...]:
        """Ports the controller listens on (engines' connections to them must never be cut)."""
        if self._controller_ports is None:
            self._controller_ports = listening_ports(process_tree(self._cluster_pids()[:1]))
        return self._controller_ports

    def launcher_running(self) -> bool:
        """Whether the engines' launcher (mpiexec) is still there and will report deaths as it ends."""
        return self._launcher is not None and self._launcher.ends_job_on_death and self._launcher.running(self._engine_set())

    def death_notes(self) -> dict[int, str]:
        """What the launcher said about ranks that died: rank -> 'exited with code 3' / 'was killed by signal 9 (Killed)'."""
        return self._launcher.death_notes(self.engine_log()) if self._launcher is not None else {}

    def _map_ranks(self, launcher: Launcher) -> None:
        rank_map.map_ranks(self, launcher)

    @property
    def stack_dir(self) -> str:
        return str(Path(self._cluster.profile_dir) / "stacks")

    @property
    def _pidfile(self) -> Path:
        return Path(self._cluster.profile_dir) / "jupyter-dist.pids"

    def _write_pidfile(self) -> None:
        """What the watchdog stops if the kernel dies: local pids, and what the launcher names (a Slurm job)."""
        pids = self._cluster_pids() + [e.pid for e in self.engines if is_local_host(e.host)]
        tokens = self._launcher.watchdog_tokens(self._engine_set()) if self._launcher is not None else []
        watchdog.write_pidfile(self._pidfile, pids, tokens)

    def _cluster_pids(self) -> list[int]:
        pids = []
        if self._cluster is None:
            return pids
        ctl = self._cluster.controller
        if ctl is not None and getattr(ctl, "pid", None):
            pids.append(ctl.pid)
        for es in self._cluster.engines.values():
            if (getattr(es, "pid", None) or 0) > 0:  # ssh engine sets have no local process (-1)
                pids.append(es.pid)
        if self._zygote is not None:
            pids.append(self._zygote.pid)
        return pids

    def stop(self) -> None:
        """Stop controller and engines; kill any process of theirs that outlives the stop."""
        background.wait(self)
        self.from_background = False
        stopping.cancel(self)
        roots = self._cluster_pids()
        groups = own_groups(roots)
        tree = process_tree(roots + [e.pid for e in self.engines if is_local_host(e.host)])
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
        if self._cluster is not None:
            with contextlib.suppress(Exception):
                self._cluster.stop_cluster_sync()
            with contextlib.suppress(Exception):
                self._cluster.remove_connection_file() if hasattr(self._cluster, "remove_connection_file") else None
        # a controller stopped right after it started may have forked its schedulers since `tree`
        # was taken: the controller and mpiexec run in process groups of their own, so take those too
        kill_all(tree + group_members(groups))
        if self._zygote is not None:
            self._zygote.stop()
            self._zygote = None
        if self._watchdog is not None:
            with contextlib.suppress(Exception):
                self._watchdog.kill()
                self._watchdog.wait(5)
        self._cluster = self._client = self._watchdog = self._launcher = None
        self._controller_ports = None
        self.node_addrs = self.node_fabrics = ()
        self.controller_ip = "127.0.0.1"
        self.shape = None
        self.engines = []
        self.agents = RankAgents()
        self.mpi_world_split, self.spares = False, None
        self._engines_changed()
        self.busy = False
        self.state = "stopped"
        self._notify()

    def _engines_changed(self) -> None:
        """New engines, or none: what was pushed to the old ones and plans made for them are stale."""
        self.applied = None
        self.generation += 1

    # -- one rank at a time (cluster/replacement.py) -------------------------------------

    def replace_dead(self, say: Callable[[str], None] | None = None) -> bool:
        """Replace the ranks whose engines died, keeping the others; False where that cannot be done."""
        background.wait(self, say)
        return replacement.replace_dead(self, say)

    def replace_ranks(self, ranks: list[int], say: Callable[[str], None] | None = None) -> None:
        """`%dist restart --rank R`: these ranks' engines killed and replaced; the others keep their state."""
        background.wait(self, say)
        replacement.replace_by_hand(self, ranks, say)

    def start_replacements(self, ranks: list[int]) -> None:
        """Kill these ranks' engines (dead or stuck) and start their replacements now, for the next run."""
        replacement.start_spares(self, ranks, only_if_replaceable=True)

    def restart(self) -> None:
        shape = self.shape
        self.stop()
        if shape is not None:
            self.start(shape)

    # -- status --------------------------------------------------------------------

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        if self.state in ("idle", "busy"):
            self.state = "busy" if busy else "idle"
        self._notify()
        if not busy and self.state == "idle":
            # a spare is a convenience: a run never fails for it, nor waits for it (cluster/idle.py)
            when_idle(self._tend)

    def set_output_flood(self, on: bool) -> None:
        """While the ranks' output floods the kernel, a crowded node's engines weigh less (cluster/session_weight.py)."""
        weight = self._zygote.weight if self._zygote is not None else None
        if weight is not None:
            weight.flooded(on)

    def output_flood_raised(self, force: bool = False) -> bool:
        """Whether the ranks raised their session's nice themselves (engine/flood_signal.py), to be set back."""
        weight = self._zygote.weight if self._zygote is not None else None
        return weight is not None and weight.raised_by_ranks(force)

    def _tend(self) -> None:
        if self.state == "idle" and self._client is not None:
            replacement.tend(self)

    def status(self) -> dict[str, Any]:
        alive_ids: set[int] = set()
        if self._client is not None:
            with contextlib.suppress(Exception):
                alive_ids = set(self._client.ids)
        spares = set(replacement.spare_ids(self)) if alive_ids else set()
        return {**status_of(self.state, self.shape, self.engines, alive_ids - spares, self.busy), "spares": len(spares)}

    def _notify(self) -> None:
        if self.on_status is not None:
            with contextlib.suppress(Exception):
                self.on_status()
