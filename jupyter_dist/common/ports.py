"""Ports for the servers a run starts (master, rendezvous, TF tasks): one `free_ports` for every caller."""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

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
