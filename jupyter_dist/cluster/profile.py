"""The cluster's folders: the state folder (settings' `state_dir`) and one owner-only profile per cluster."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from jupyter_dist.plan.settings import settings


def state_dir() -> Path:
    """Where profiles, per-rank logs and stacks go (`DistSettings.state_dir`, read when called)."""
    return Path(settings().state_dir)


def make_profile_dir(cluster_id: str) -> Path:
    """`<state dir>/profiles/<cluster_id>`, created; it and the folders above it are the owner's only."""
    root = state_dir()
    profile_dir = root / "profiles" / cluster_id
    profile_dir.mkdir(parents=True, exist_ok=True)
    for d in (root, root / "profiles", profile_dir):
        os.chmod(d, 0o700)
    return profile_dir


def lock_down(root: Path) -> None:
    """Connection files, logs and everything else of a cluster: readable by its owner only."""
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o700)
        for name in filenames:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(dirpath, name), 0o600)
