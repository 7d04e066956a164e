"""`python -m jupyter_dist.cluster.watchdog KERNEL_PID PIDFILE`: stop the cluster if the kernel dies.

A kernel that is killed (restart, SIGKILL) runs no atexit handler; the controller, `mpiexec`
and engines run in process groups of their own and would outlive it. This process, in a
session of its own, polls the kernel and kills every process listed in PIDFILE (and their children),
and cancels the Slurm job listed there (`slurm:ID`), so that no job outlives the kernel.
The kernel side writes PIDFILE (`write_pidfile`) and starts this process (`start`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

from jupyter_dist.cluster.processes import kill_all, process_tree


def write_pidfile(path: Path, pids: Iterable[int], tokens: Iterable[str] = ()) -> None:
    """Local pids, then other things to stop (`slurm:ID`), space-separated."""
    path.write_text(" ".join([*(str(p) for p in sorted(set(pids))), *tokens]))


def start(pidfile: Path) -> subprocess.Popen:
    """A watchdog of this process (the kernel), in a session of its own."""
    return subprocess.Popen(
        [sys.executable, "-m", "jupyter_dist.cluster.watchdog", str(os.getpid()), str(pidfile)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def read_tokens(path: str) -> list[str]:
    with contextlib.suppress(OSError), open(path) as f:
        return f.read().split()
    return []


def read_pids(path: str) -> list[int]:
    return [int(tok) for tok in read_tokens(path) if tok.isdigit()]


def read_slurm_jobs(path: str) -> list[str]:
    """Slurm job ids (`slurm:ID` tokens): the engines' job, cancelled so it does not outlive the kernel."""
    return [tok.split(":", 1)[1] for tok in read_tokens(path) if tok.startswith("slurm:") and tok[6:].isdigit()]


def stop_all(pidfile: str) -> None:
    jobs = read_slurm_jobs(pidfile)
    kill_all(process_tree(read_pids(pidfile)))
    if jobs and shutil.which("scancel"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["scancel", *jobs], stdin=subprocess.DEVNULL, capture_output=True, timeout=30)


def main(argv: list[str]) -> int:
    kernel_pid, pidfile = int(argv[0]), argv[1]
    try:
        kernel = psutil.Process(kernel_pid)
        started = kernel.create_time()
    except psutil.Error:
        stop_all(pidfile)
        return 0
    while True:
        try:
            if not kernel.is_running() or kernel.create_time() != started or kernel.status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.Error:
            break
        time.sleep(1.0)
    stop_all(pidfile)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
