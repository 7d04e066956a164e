"""`Layout`: ranks to nodes, local ranks and hosts; the master address and ports.

Nodes are "virtual" when several share this host: the layout is the same data either way,
so going multi-host changes the host list, not the design.
"""

from __future__ import annotations

import contextlib
import random
import socket
from dataclasses import dataclass
from pathlib import Path

LOCAL_HOSTS = frozenset({"", "localhost", "127.0.0.1", "::1"})


def is_local_host(host: str) -> bool:
    if host in LOCAL_HOSTS:
        return True
    return host in {socket.gethostname(), socket.getfqdn()}


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


LISTEN_PORTS_LOW = 20000  # ports handed out for servers come from here up to the ephemeral range


def ephemeral_low() -> int:
    """The first port Linux may give an outgoing connection (`ip_local_port_range`)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return 32768


def free_ports(count: int, host: str = "127.0.0.1") -> tuple[int, ...]:
    """`count` distinct ports free on `host` now (all sockets held open until all are chosen).

    They are picked below the ephemeral range: a port the kernel hands out for port 0 can, before
    the server that it is for binds it (a TF gRPC server binds at the strategy's creation, minutes
    later), become the local port of any outgoing connection, and the server fails to start.
    """
    socks: list[socket.socket] = []
    low, high = LISTEN_PORTS_LOW, ephemeral_low()
    candidates = random.sample(range(low, high), min(high - low, 64 * count)) if high - low >= count else []
    try:
        for port in candidates:
            if len(socks) == count:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        while len(socks) < count:  # no room below the ephemeral range: let the kernel choose
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return tuple(s.getsockname()[1] for s in socks)
    finally:
        for s in socks:
            s.close()


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


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
