"""The processes that do a rank's work while its engine only waits: --fresh's child, torchrun's workers.

`script_fresh` and `torchrun_agent` `watch` the child they start and `forget` it when it ends. While
one is watched, the sampler (resources.py) and the stacks (stacks.py) report each worker in place
of the engine, which meanwhile waits on the child's pipes. A worker is the watched process or one
under it whose command line runs `-m <module>` (torchrun's own command line names that module
later, as its script); its rank is the one given (--fresh: None, this engine's own) or the `RANK`
its environment holds (torchrun sets it for each worker).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

_lock = threading.Lock()
_watched: dict[int, tuple[str, int | None]] = {}  # root pid -> (worker module, rank or None)
_ranks: dict[int, int | None] = {}  # worker pid -> rank, read once from its environment


def watch(pid: int, module: str, rank: int | None = None) -> None:
    """Report the workers under `pid` (itself included) that run `-m module`; `rank` None: this engine's."""
    with _lock:
        _watched[pid] = (module, rank)


def forget(pid: int) -> None:
    with _lock:
        _watched.pop(pid, None)
        if not _watched:
            _ranks.clear()


def watching() -> bool:
    return bool(_watched)


def workers() -> list[tuple[int | None, int]]:
    """(rank, pid) of every live worker, by rank (None: this engine's own rank); [] when none is watched."""
    with _lock:
        watched = dict(_watched)
    if not watched:
        return []
    import psutil  # a dependency of jupyter-dist; only needed while a child is watched

    found: list[tuple[int | None, int]] = []
    for root, (module, rank) in watched.items():
        with contextlib.suppress(psutil.Error):
            top = psutil.Process(root)
            for proc in (top, *top.children(recursive=True)):
                with contextlib.suppress(psutil.Error):
                    if runs_module(proc.cmdline(), module):
                        found.append((rank if rank is not None else _rank_of(proc), proc.pid))
    return sorted(found, key=lambda w: (w[0] is not None, w[0] or 0, w[1]))


def runs_module(cmdline: list[str], module: str) -> bool:
    """The command line's first `-m` runs `module` (`python -u -m module ...`)."""
    for i, arg in enumerate(cmdline[:-1]):
        if arg == "-m":
            return cmdline[i + 1] == module
    return False


def _rank_of(proc: Any) -> int | None:
    if proc.pid not in _ranks:
        rank = None
        with contextlib.suppress(Exception):  # an environment we may not read: the engine's rank
            rank = int(proc.environ()["RANK"])
        _ranks[proc.pid] = rank
    return _ranks[proc.pid]
