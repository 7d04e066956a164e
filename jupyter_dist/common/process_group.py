"""Children in a process group of their own: the kernel's launchers and a node's torchrun use it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Any


def own_group() -> dict[str, Any]:
    """`subprocess.Popen` arguments for a child in a process group of its own, in this session."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}


def stop_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM to the child's whole process group (a launcher stops its workers), then SIGKILL after `grace` s."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    end = time.monotonic() + grace
    while proc.poll() is None and time.monotonic() < end:
        time.sleep(0.05)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
