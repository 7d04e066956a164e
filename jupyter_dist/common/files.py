"""Per-rank files in the cluster's stack folder: the engine writes them, the notebook reads them.

A rank's stack file holds its last all-thread stack dump (taken on SIGUSR1); its crash file what
faulthandler wrote when the process died of a fatal signal.
"""

from __future__ import annotations

import os


def stack_file(stack_dir: str, rank: int) -> str:
    return os.path.join(stack_dir, f"stack-rank-{rank}.txt")


def crash_file(stack_dir: str, rank: int) -> str:
    return os.path.join(stack_dir, f"crash-rank-{rank}.txt")


def read_stack(stack_dir: str, rank: int) -> str:
    """The last stack dump of `rank` (empty if none)."""
    return _read(stack_file(stack_dir, rank))


def read_crash(stack_dir: str, rank: int) -> str:
    """What faulthandler wrote when `rank` crashed (empty if it did not)."""
    return _read(crash_file(stack_dir, rank))


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""
