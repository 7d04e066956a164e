"""One rank's engine replaced, the others kept: a dead rank (exit, signal, OOM kill) or one that did
not stop after a `--timeout` gets a new engine that joins the running controller.

How the new engine is made (docs/reliability.md): the cluster's engine launcher starts one more
engine set of one engine (under `--launcher mpi`, its own `mpiexec -n 1`, with the same Open MPI
settings), and the notebook gives it the rank by hand (`assign_rank`), as it gave the first ones
theirs; the rank's environment is pushed to it by the next run's set-up like to any new engine.
Its MPI world is its own (size 1): the old MPI world is broken for the survivors too (a dead member),
so a run that needs MPI's world (`-f mpi`, `-f horovod`, `--backend mpi`) restarts the whole cluster
(`mpi_world_split`). torch's groups are made over TCP (`env://`) and take the new engine at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jupyter_dist.cluster.agents import AgentAddress
from jupyter_dist.cluster.launch_session import in_this_session
from jupyter_dist.cluster.processes import pid_alive
from jupyter_dist.common.hosts import is_local_host
from jupyter_dist.engine import release as engine_side_release
from jupyter_dist.engine import setup as engine_side
from jupyter_dist.plan.settings import settings

if TYPE_CHECKING:
    from jupyter_dist.cluster.engines import EngineCluster

REPLACEABLE_LAUNCHERS = ("mpi", "local")
ENGINE_SETS = {"mpi": "MPIEngineSetLauncher", "local": "LocalEngineSetLauncher"}  # ipyparallel's config sections
# what the ranks imported is asked of a rank's agent at most this often: not after every cell (a warm 20 ms cell
# paid an agent round trip, a thread on rank 0, 2-5 ms of the kernel's loop); a new import reaches the spares later
LOADED_EVERY_S = 5.0


def dead_ranks(cluster: EngineCluster) -> list[int]:
    """Ranks whose engine is gone: no longer registered, or (where local) its process ended."""
    try:
        ids = set(cluster.client.ids)
    except Exception:  # noqa: BLE001 - a broken client: every rank counts as gone
        return [e.rank for e in cluster.engines]
    return [e.rank for e in cluster.engines
            if e.engine_id not in ids or (is_local_host(e.host) and not pid_alive(e.pid))]


def why_not(cluster: EngineCluster, ranks: list[int]) -> str | None:
    """Why these ranks cannot be replaced one by one (the whole cluster restarts), or None."""
    shape = cluster.shape
    if shape is None or not ranks:
        return "no cluster"
    if shape.launcher not in REPLACEABLE_LAUNCHERS:
        return f"--launcher {shape.launcher} replaces no single engine"
    if any(not is_local_host(cluster.engines[r].host) for r in ranks):
        return "the dead rank was on another host"
    if len(ranks) == len(cluster.engines):
        return "every rank is gone"
    return None


def condemn(cluster: EngineCluster, ranks: list[int]) -> None:
    """Kill these ranks' engines (stuck in native code, deaf to every signal a cell can take)."""
    for r in ranks:
        e = cluster.engines[r]
        if is_local_host(e.host):
            with contextlib.suppress(OSError):
                os.kill(e.pid, signal.SIGKILL)


@dataclass
class Spares:
    """Engines started and given no rank yet, oldest first: the warm spares (`DistSettings.spare_engines`)
    and those started at a death. A dead rank's place goes to the oldest, registered by then."""

    # the engines that hold or held a rank, by their registration (ipyparallel's engine uuid): every other
    # registered engine is a spare. Not by id: the controller gives a new MPI engine the id it asks for, its
    # MPI rank, which may be a dead engine's id
    ranked: set[str]
    starts: list[float] = field(default_factory=list)  # when each spare was started, oldest first
    preloaded: frozenset[str] = frozenset()  # the modules every registered spare was told to import
    pids: dict[str, int] = field(default_factory=dict)  # registered spares' processes, once they said
    asked: dict[str, Any] = field(default_factory=dict)  # spares asked for their pid (ipyparallel results)
    dead: set[str] = field(default_factory=set)  # spares whose engine is gone: never given a rank
    seen: set[str] = field(default_factory=set)  # spares seen registered (a spare given a rank leaves it)
    loaded: frozenset[str] = frozenset()  # what the ranks had imported when last asked (_loaded_lately)
    loaded_at: float = -1e9  # when that was (monotonic)

    @property
    def count(self) -> int:
        return len(self.starts)


def replace_dead(cluster: EngineCluster, say: Callable[[str], None] | None = None) -> bool:
    """Replace the ranks whose engines died; False where that cannot be done or failed (the caller
    restarts the whole cluster then)."""
    dead = dead_ranks(cluster)
    if why_not(cluster, dead) is not None:
        return False
    try:
        replace(cluster, dead, say)
    except Exception as e:  # noqa: BLE001 - the whole cluster restarts instead, and says so
        if say is not None:
            say(f"the replacement of {_words(dead)} failed ({type(e).__name__}: {e})")
        return False
    return True


def replace_by_hand(cluster: EngineCluster, ranks: list[int], say: Callable[[str], None] | None = None) -> None:
    if (why := why_not(cluster, ranks)) is not None:
        raise RuntimeError(f"{_words(ranks)} cannot be replaced alone: {why}; %dist restart restarts every rank")
    condemn(cluster, ranks)
    replace(cluster, ranks, say)


def wanted_spares(cluster: EngineCluster) -> int:
    """How many warm spares this cluster keeps: the setting, where a spare could take a rank's place."""
    shape = cluster.shape
    if shape is None or shape.launcher not in REPLACEABLE_LAUNCHERS or not cluster.engines:
        return 0
    if any(not is_local_host(e.host) for e in cluster.engines):
        return 0
    return settings().spare_engines


def start_spares(cluster: EngineCluster, ranks: list[int], only_if_replaceable: bool = False) -> None:
    """Kill these ranks' engines (dead or stuck) and start what the next run needs to replace them at once:
    a spare per rank, beyond the warm spares kept (which take the ranks' places; these become the next)."""
    if only_if_replaceable and why_not(cluster, ranks) is not None:
        return
    condemn(cluster, ranks)
    pool = _pool(cluster)
    _start(cluster, len(ranks) + wanted_spares(cluster) - pool.count)


def tend(cluster: EngineCluster) -> None:
    """After a run: the warm spares started if they are fewer than the setting, and told to import what
    the ranks imported (in the background: nothing here waits for an engine)."""
    wanted = wanted_spares(cluster)
    if not wanted or not cluster.running:
        return
    pool = _pool(cluster)
    if pool.count < wanted:
        _start(cluster, wanted - pool.count)
        return  # they import at start what the ranks had imported (_start)
    names = _loaded_lately(cluster, pool)
    if names <= pool.preloaded:
        return
    ids = _registered(cluster.client, pool)
    if len(ids) < pool.count:
        return  # one is still starting: next time
    cluster.client[ids].apply_async(engine_side_release.preload, sorted(names))
    pool.preloaded = names | pool.preloaded


def _pool(cluster: EngineCluster) -> Spares:
    """The cluster's spares, less any whose process has ended (killed, OOM): a dead spare never takes a
    rank's place, and is counted no more, so the next start makes up for it."""
    if cluster.spares is None:
        cluster.spares = Spares({_uuid(cluster.client, eid) for eid in cluster.client.ids})
    pool: Spares = cluster.spares
    with contextlib.suppress(Exception):  # a spare is a convenience: its check never fails a run
        _drop_dead(cluster.client, pool)
    return pool


def _drop_dead(client: Any, pool: Spares) -> None:
    """Spares whose engine is gone: registered once and no longer (the controller drops a killed engine
    within a second or so here), or still registered with their process ended (each is asked its pid once,
    answered when it is free; checked locally after that)."""
    now = {_uuid(client, eid): eid for eid in client.ids}
    for uuid in sorted(pool.seen - set(now) - pool.dead):
        _lost(pool, uuid)
    for uuid, eid in now.items():
        if uuid in pool.ranked or uuid in pool.dead:
            continue
        pool.seen.add(uuid)
        if uuid not in pool.pids:
            if uuid not in pool.asked:
                pool.asked[uuid] = client[eid].apply_async(engine_side.identify)
            if not pool.asked[uuid].ready():
                continue
            info = pool.asked.pop(uuid).get(0)
            pool.pids[uuid] = info["pid"] if is_local_host(info["host"]) else 0  # 0: not checked from here
        if pool.pids[uuid] and not pid_alive(pool.pids[uuid]):
            _lost(pool, uuid)


def _lost(pool: Spares, uuid: str) -> None:
    pool.dead.add(uuid)
    del pool.starts[:1]  # one spare fewer; the oldest start stands for it


def _loaded_lately(cluster: EngineCluster, pool: Spares) -> frozenset[str]:
    """What the ranks have imported, asked again once the last answer is LOADED_EVERY_S old."""
    now = time.monotonic()
    if now - pool.loaded_at >= LOADED_EVERY_S:
        pool.loaded, pool.loaded_at = frozenset(_loaded(cluster)), now
    return pool.loaded


def _loaded(cluster: EngineCluster) -> list[str]:
    """What the ranks have imported among the preloadable modules (asked of a live rank's agent)."""
    dead = set(dead_ranks(cluster))
    alive = [e.rank for e in cluster.engines if e.rank not in dead][:1]
    return cluster.agents.ask("loaded", alive, timeout=1.0).results.get(alive[0], []) if alive else []


def _start(cluster: EngineCluster, n: int) -> None:
    """Start n engines of the launcher's kind (see the module), which import what the ranks had imported."""
    if n <= 0:
        return
    pool = _pool(cluster)
    preload = _loaded(cluster)
    conf = getattr(cluster._cluster.config, ENGINE_SETS.get(cluster.shape.launcher if cluster.shape else "", "x"), None)
    args = list(conf.engine_args) if conf is not None and "engine_args" in conf else []
    if conf is not None and preload:
        # imported while the engine starts, so not by the next cell: the rank it replaces had them
        # in place of the ranks' own (cluster/preload.py): an engine takes one startup command
        kept = [a for a in args if not a.startswith("--IPEngine.startup_command=")]
        conf.engine_args = [*kept, "--IPEngine.startup_command=import " + ", ".join(preload)]
    try:
        with in_this_session():
            cluster._cluster.start_engines_sync(n)
    finally:
        if conf is not None and preload:
            conf.engine_args = args
    if pool.count == 0:
        pool.preloaded = frozenset(preload)
    else:
        pool.preloaded = pool.preloaded & frozenset(preload)
    pool.starts.extend([time.monotonic()] * n)
    cluster._write_pidfile()  # the watchdog stops the new mpiexec too, if the kernel dies


def replace(cluster: EngineCluster, ranks: list[int], say: Callable[[str], None] | None = None) -> None:
    """Give each rank in `ranks` a new engine (a warm spare, else one started at its death or now) and its rank."""
    ranks = sorted(ranks)
    pool = _pool(cluster)
    _start(cluster, len(ranks) - pool.count)
    client = cluster.client
    started = pool.starts[0]
    new = _wait_for_new(client, pool, len(ranks), pool.starts[len(ranks) - 1])
    infos = client[new].apply_sync(engine_side.identify)
    pending = {}
    for rank, eid, info in zip(ranks, new, infos, strict=True):
        cluster.engines[rank] = dataclasses.replace(cluster.engines[rank], engine_id=eid, pid=info["pid"],
                                                    host=info["host"])
        pending[rank] = client[eid].apply_async(engine_side.assign_rank, rank, cluster.stack_dir,
                                                cluster.agents.token, cluster.controller_ip)
    for rank, ar in pending.items():
        cluster.agents.addresses[rank] = AgentAddress(*ar.get(30))
    pool.ranked |= {_uuid(client, eid) for eid in new}
    pool.seen -= pool.ranked
    del pool.starts[:len(ranks)]
    cluster.rotate_master_port()  # the survivors' group is replaced by one the new rank joins
    if cluster.shape is not None and cluster.shape.launcher == "mpi":
        cluster.mpi_world_split = True
    # new engines: the watchdog's list; what was pushed to the old ones and plans made for them are stale
    cluster._write_pidfile()
    cluster._engines_changed()
    cluster._notify()
    if say is not None:
        kept = [e.rank for e in cluster.engines if e.rank not in ranks]
        one = len(ranks) == 1
        say(f"{_words(ranks)} {'was' if one else 'were'} replaced by a new engine (started "
            f"{time.monotonic() - started:.1f} s ago): {'its' if one else 'their'} variables are gone; "
            f"{_words(kept)} kept theirs")
    _start(cluster, wanted_spares(cluster) - pool.count)  # the warm spares made whole again, for the next death


def _registered(client: Any, pool: Spares) -> list[int]:
    return [eid for eid in sorted(client.ids) if _uuid(client, eid) not in pool.ranked | pool.dead]


def _uuid(client: Any, eid: int) -> str:
    return str(client._engines.get(eid))  # ipyparallel's id -> registration map (a ReverseDict)


def spare_ids(cluster: EngineCluster) -> list[int]:
    """The registered spares' engine ids (started, given no rank)."""
    return _registered(cluster.client, cluster.spares) if cluster.spares is not None and cluster.running else []


def _wait_for_new(client: Any, pool: Spares, n: int, t0: float) -> list[int]:
    timeout = settings().start_timeout
    while True:
        new = _registered(client, pool)
        if len(new) >= n:
            return new[:n]
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"the replacement engine did not register within {timeout:.0f} s")
        time.sleep(0.05)


def _words(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)
