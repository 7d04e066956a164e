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
from typing import TYPE_CHECKING, Any

from jupyter_dist.cluster.agents import AgentAddress
from jupyter_dist.cluster.launch_session import in_this_session
from jupyter_dist.cluster.processes import pid_alive
from jupyter_dist.common.hosts import is_local_host
from jupyter_dist.engine import setup as engine_side
from jupyter_dist.plan.settings import settings

if TYPE_CHECKING:
    from jupyter_dist.cluster.engines import EngineCluster

REPLACEABLE_LAUNCHERS = ("mpi", "local")


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


def replace(cluster: EngineCluster, ranks: list[int], say: Callable[[str], None] | None = None) -> None:
    """Start one engine per rank in `ranks`, give each its rank, and put them in the cluster."""
    condemn(cluster, ranks)
    client = cluster.client
    known = set(client.ids) | {e.engine_id for e in cluster.engines}
    t0 = time.monotonic()
    with in_this_session():
        cluster._cluster.start_engines_sync(len(ranks))
    new = _wait_for_new(client, known, len(ranks), t0)
    infos = client[new].apply_sync(engine_side.identify)
    pending = {}
    for rank, eid, info in zip(sorted(ranks), new, infos, strict=True):
        cluster.engines[rank] = dataclasses.replace(cluster.engines[rank], engine_id=eid, pid=info["pid"],
                                                    host=info["host"])
        pending[rank] = client[eid].apply_async(engine_side.assign_rank, rank, cluster.stack_dir,
                                                cluster.agents.token, cluster.controller_ip)
    for rank, ar in pending.items():
        cluster.agents.addresses[rank] = AgentAddress(*ar.get(30))
    if cluster.shape is not None and cluster.shape.launcher == "mpi":
        cluster.mpi_world_split = True
    cluster.after_replacement()
    if say is not None:
        kept = [e.rank for e in cluster.engines if e.rank not in ranks]
        say(f"{_words(ranks)} {'was' if len(ranks) == 1 else 'were'} replaced by a new engine in "
            f"{time.monotonic() - t0:.1f} s: {'its' if len(ranks) == 1 else 'their'} variables are gone; "
            f"{_words(kept)} kept theirs")


def _wait_for_new(client: Any, known: set[int], n: int, t0: float) -> list[int]:
    timeout = settings().start_timeout
    while True:
        new = sorted(set(client.ids) - known)
        if len(new) >= n:
            return new[:n]
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"the replacement engine did not register within {timeout:.0f} s")
        time.sleep(0.05)


def _words(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)
