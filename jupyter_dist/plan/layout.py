"""`Layout`: ranks to nodes, local ranks and hosts; the master address and ports.

Nodes are "virtual" when several share this host: the layout is the same data either way,
so going multi-host changes the host list, not the design.
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass

from jupyter_dist.common.hosts import LOCAL_HOSTS, is_local_host


@dataclass(frozen=True)
class RankPlace:
    rank: int
    node: int
    local_rank: int
    host: str


@dataclass(frozen=True)
class Layout:
    nodes: int
    procs_per_node: int
    hosts: tuple[str, ...]  # one per node; "127.0.0.1" for this host
    master_addr: str
    master_port: int
    task_ports: tuple[int, ...] = ()  # one per rank, for frameworks with per-task endpoints (TF)

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def all_local(self) -> bool:
        return all(is_local_host(h) for h in self.hosts)

    def node_of(self, rank: int) -> int:
        return rank // self.procs_per_node

    def local_rank_of(self, rank: int) -> int:
        return rank % self.procs_per_node

    def host_of(self, rank: int) -> str:
        return self.hosts[self.node_of(rank)]

    def place(self, rank: int) -> RankPlace:
        if not 0 <= rank < self.world_size:
            raise IndexError(f"rank {rank} outside world of {self.world_size}")
        return RankPlace(rank, self.node_of(rank), self.local_rank_of(rank), self.host_of(rank))

    def places(self) -> list[RankPlace]:
        return [self.place(r) for r in range(self.world_size)]

    def grid(self) -> list[list[int]]:
        """Ranks as rows of nodes and columns of local ranks."""
        p = self.procs_per_node
        return [list(range(n * p, (n + 1) * p)) for n in range(self.nodes)]


def build_layout(
    nodes: int,
    procs_per_node: int,
    hosts: tuple[str, ...] = (),
    *,
    master_port: int,
    task_ports: tuple[int, ...] = (),
) -> Layout:
    """Hosts default to this host for every node; the master is node 0's address."""
    if not hosts:
        hosts = ("127.0.0.1",) * nodes
    if len(hosts) != nodes:
        raise ValueError(f"{len(hosts)} hosts for {nodes} nodes")
    norm = tuple("127.0.0.1" if h in LOCAL_HOSTS else h for h in hosts)
    all_here = all(is_local_host(h) for h in norm)
    master = master_address(norm, all_here)
    return Layout(nodes, procs_per_node, norm, master, master_port, task_ports)


def master_address(hosts: tuple[str, ...], all_here: bool) -> str:
    """Node 0 as every node reaches it: loopback only when all nodes are here. When node 0 is this
    host among others, its name (the running cluster replaces it by the address node 0 uses)."""
    if all_here:
        return "127.0.0.1"
    if is_local_host(hosts[0]):
        return socket.getfqdn()
    return hosts[0]


def resolve_address(host: str) -> str:
    """Best-effort numeric address for `host` (used where a framework wants host:port)."""
    with contextlib.suppress(OSError):
        return socket.gethostbyname(host)
    return host
