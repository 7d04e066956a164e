"""A session's scheduler autogroup nice, read and written through `/proc/PID/autogroup` (Linux with
autogroups). Read on both sides: each crowded engine sets its own session's (engine/sessions.py), the
kernel the fork server's while the ranks' output floods it (cluster/session_weight.py)."""

from __future__ import annotations

import errno


def autogroup_path(pid: int | None = None) -> str:
    """The autogroup file of process `pid` (None: this process)."""
    return f"/proc/{'self' if pid is None else pid}/autogroup"


def parse_nice(text: str) -> int | None:
    """The nice in a `/proc/PID/autogroup` line (`/autogroup-123 nice 0`), None if it has none."""
    parts = text.split()
    if len(parts) >= 3 and parts[-2] == "nice":
        try:
            return int(parts[-1])
        except ValueError:
            return None
    return None


def write_nice(path: str, nice: int) -> int:
    """0 when set, else the errno (EAGAIN: too soon after another change machine-wide; ENOENT or ESRCH: no
    autogroups, or the process is gone)."""
    try:
        with open(path, "w") as f:
            f.write(str(nice))
    except OSError as e:
        return e.errno or errno.EIO
    return 0
