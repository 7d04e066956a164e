"""Local processes of a cluster: is one alive, its tree, its process groups, and killing them."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

import psutil


def pid_alive(pid: int) -> bool:
    """Whether a process of this pid exists: a signal-0 probe, no /proc read (checked before every run)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_tree(pids: Iterable[int]) -> list[psutil.Process]:
    """The processes of `pids` that still exist, and all their descendants."""
    procs: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
        except psutil.Error:
            continue
        procs[p.pid] = p
        with contextlib.suppress(psutil.Error):
            for c in p.children(recursive=True):
                procs[c.pid] = c
    return list(procs.values())


def own_groups(pids: Iterable[int]) -> set[int]:
    """The process groups of `pids` that are not this process's own group."""
    mine = os.getpgid(0)
    groups = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            pgid = os.getpgid(pid)
            if pgid != mine:
                groups.add(pgid)
    return groups


def group_members(pgids: set[int]) -> list[psutil.Process]:
    if not pgids:
        return []
    members = []
    for p in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(p.pid) in pgids:
                members.append(p)
    return members


def kill_all(procs: list[psutil.Process], grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL for whatever is still there after `grace` seconds."""
    alive = [p for p in procs if p.is_running()]
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(alive, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace)


def listening_ports(procs: Iterable[psutil.Process]) -> tuple[int, ...]:
    """The TCP ports `procs` listen on, sorted."""
    ports: set[int] = set()
    for p in procs:
        with contextlib.suppress(psutil.Error):
            ports.update(c.laddr.port for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN)
    return tuple(sorted(ports))
