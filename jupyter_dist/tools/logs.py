"""`%dist logs`: where the per-rank logs of recent runs are, and how much the retention keeps."""

from __future__ import annotations

from jupyter_dist.cluster.profile import state_dir
from jupyter_dist.cluster.retention import Usage, usage
from jupyter_dist.plan.settings import settings

RECENT = 5


def logs_report() -> list[str]:
    """Lines: the log folder, the most recent runs' folders (each holds rank-N.stdout/.stderr), the totals."""
    logs, profiles = usage(state_dir() / "logs"), usage(state_dir() / "profiles")
    lines = [f"per-rank logs of each run: {logs.folder}"]
    if logs.folder.is_dir():
        recent = sorted((p for p in logs.folder.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
        for p in recent[:RECENT]:
            lines.append(f"  {p.name}: " + ", ".join(sorted(f.name for f in p.iterdir())[:8]))
    keep = settings().keep_folders
    lines.append(f"{_sized(logs)} run folders, {_sized(profiles)} cluster profiles ({profiles.folder})")
    lines.append(f"retention: the newest {keep} of each are kept, never a live kernel's "
                 "(%config DistSettings.keep_folders = N; 0 keeps all)" if keep > 0 else
                 "retention: off, every folder is kept (%config DistSettings.keep_folders = N)")
    return lines


def _sized(u: Usage) -> str:
    return f"{u.count} ({u.size / 1e6:.1f} MB)"
