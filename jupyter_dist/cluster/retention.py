"""Old run-log and profile folders removed past `DistSettings.keep_folders`, a live kernel's never.

Each folder's name carries the pid of the kernel that made it (`jd-<pid>-<hex>` for a profile,
`<date>-<time>-<pid>-<n>` for a run's logs): a folder whose kernel still runs is kept whatever its
age, so neither the current run's folder nor another open notebook's is removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from jupyter_dist.cluster.processes import pid_alive
from jupyter_dist.cluster.profile import state_dir
from jupyter_dist.plan.settings import settings

KINDS = ("logs", "profiles")


@dataclass(frozen=True)
class Usage:
    folder: Path
    count: int
    size: int  # bytes


def owner_pid(name: str) -> int | None:
    """The kernel pid in a log or profile folder's name."""
    parts = name.split("-")
    candidates = {"jd": parts[1:2]}.get(parts[0], parts[2:3]) if len(parts) >= 3 else []
    return int(candidates[0]) if candidates and candidates[0].isdigit() else None


def prune(folder: Path, keep: int) -> list[Path]:
    """Remove the oldest subfolders of `folder` past `keep` (0: none), a live kernel's never; returns them."""
    if keep <= 0 or not folder.is_dir():
        return []
    entries = [e for e in os.scandir(folder) if e.is_dir(follow_symlinks=False)]
    if len(entries) <= keep:
        return []
    mine = os.getpid()
    aged = sorted(entries, key=lambda e: e.stat(follow_symlinks=False).st_mtime, reverse=True)
    removed = []
    for e in aged[keep:]:
        pid = owner_pid(e.name)
        if pid == mine or (pid is not None and pid_alive(pid)):
            continue
        with contextlib.suppress(OSError):
            shutil.rmtree(e.path)
            removed.append(Path(e.path))
    return removed


def prune_all() -> list[Path]:
    """Both kinds, under the state folder, to the setting."""
    keep = settings().keep_folders
    return [p for kind in KINDS for p in prune(state_dir() / kind, keep)]


def usage(folder: Path) -> Usage:
    count = size = 0
    if folder.is_dir():
        for dirpath, dirnames, filenames in os.walk(folder):
            if Path(dirpath) == folder:
                count = len(dirnames)
            for name in filenames:
                with contextlib.suppress(OSError):
                    size += os.lstat(os.path.join(dirpath, name)).st_size
    return Usage(folder, count, size)
