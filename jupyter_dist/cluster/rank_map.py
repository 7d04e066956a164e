"""Engines up to ranks: wait for them to register, map each to its rank, probe the nodes.

Moved out of `engines.py` (`EngineCluster` delegates here). Each engine is asked `identify` (who it
is) as soon as it registers, while the others still start; once all are up, one `assign_ranks`
message to all carries the whole table, each engine taking its own line (by host and pid), where
there was one `assign_rank` round trip per engine, after an `identify` of all, before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jupyter_dist.cluster import hosts as hostmod
from jupyter_dist.cluster.agents import AgentAddress, RankAgents
from jupyter_dist.common.node import NodeFabric
from jupyter_dist.engine import node_probe
from jupyter_dist.engine import setup as engine_side
from jupyter_dist.plan.settings import settings

if TYPE_CHECKING:
    from jupyter_dist.cluster.engines import EngineCluster
    from jupyter_dist.cluster.launchers import Launcher


@dataclass
class EngineInfo:
    rank: int
    engine_id: int
    pid: int
    host: str


def wait_for_engines(cluster: EngineCluster, client: Any, n: int, t0: float,
                     progress: Callable[[int, int, float], None] | None) -> None:
    """Until n engines registered (progress told as they come), or the start timeout. Each engine is
    asked who it is (`identify`) as soon as it registers, while the others still start: at 32 ranks on
    2 cores mapping them all after the last one had registered took 3.5 s."""
    timeout = settings().start_timeout
    last = -1
    asked: dict[int, Any] = {}
    cluster.identified = asked
    while True:
        ids = client.ids
        for eid in ids:
            if eid not in asked:
                asked[eid] = client[eid].apply_async(engine_side.identify)
        up = len(ids)
        elapsed = time.monotonic() - t0
        if progress and up != last:
            progress(up, n, elapsed)
            last = up
        if up >= n:
            if progress:
                progress(up, n, elapsed)
            return
        if elapsed > timeout:
            raise TimeoutError(
                f"only {up} of {n} engines registered after {elapsed:.0f} s; engine log:\n{cluster.engine_log()[-3000:]}"
            )
        cluster._check_engines_running()
        time.sleep(0.05)
        if progress and int(elapsed * 2) != int((elapsed - 0.05) * 2):
            progress(up, n, elapsed)


def map_ranks(cluster: EngineCluster, launcher: Launcher) -> None:
    """Each engine's rank as the launcher says; every rank given its rank, stack files and agent."""
    client = cluster.client
    world_size = launcher.shape.world_size
    ids = sorted(client.ids)
    early: dict[int, Any] = cluster.identified or {}
    cluster.identified = None
    if all(eid in early for eid in ids):  # asked as each registered (wait_for_engines)
        infos = [early[eid].get(timeout=settings().start_timeout) for eid in ids]
    else:
        infos = client[ids].apply_sync(engine_side.identify)
    ranks = launcher.ranks(client, ids, infos, cluster.controller_ip)
    by_rank = {ranks[eid]: EngineInfo(ranks[eid], eid, info["pid"], info["host"])
               for eid, info in zip(ids, infos, strict=True)}
    cluster.engines = [by_rank[r] for r in range(world_size)]
    cluster.inherited_env = frozenset(infos[0]["env_keys"])
    cluster.agents = RankAgents()
    table = {(e.host, e.pid): e.rank for e in cluster.engines}
    got = client[[e.engine_id for e in cluster.engines]].apply_sync(
        engine_side.assign_ranks, table, cluster.stack_dir, cluster.agents.token, cluster.controller_ip)
    for e, (host, port) in zip(cluster.engines, got, strict=True):
        cluster.agents.addresses[e.rank] = AgentAddress(host, port)


def probe_nodes(cluster: EngineCluster, nodes: int, controller_ip: str) -> None:
    """Each node's address (node 0's toward the controller, the others' toward node 0), its
    fabric as detected on it, and ports free there: asked of each node's first engine."""
    client = cluster.client
    ppn = len(cluster.engines) // nodes
    leaders = [cluster.engines[n * ppn].engine_id for n in range(nodes)]
    first = client[leaders[0]].apply_sync(node_probe.node_view, controller_ip, None, ppn)
    master = first["addr"]
    rest = client[leaders[1:]].apply_async(node_probe.node_view, master, master, ppn) if leaders[1:] else None
    views = [first, *(rest.get(timeout=60) if rest is not None else [])]
    cluster.node_addrs, cluster.task_ports, cluster.master_port = hostmod.node_plan(views)
    cluster.node_fabrics = tuple(NodeFabric.from_json(v["fabric"]) for v in views)
