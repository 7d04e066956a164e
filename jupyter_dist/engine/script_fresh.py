"""`%distrun --fresh script.py`: the script in a new child process of each rank's engine.

Where a warm re-run cannot be made clean (a framework that keeps state no reset reaches, a C
extension's global, a script that leaves threads or `atexit` work), a process of its own is the
honest answer. The child gets the rank's environment and working folder; its output streams into
the rank's output line by line; its `report()` batches and counted optimizer steps come as metric
lines (common.channel's METRICS_LINE_PREFIX), which the notebook takes out of the output; its exit
status is the rank's. Its stdin is empty (EOF), and an interrupt of the engine stops it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import IO, Any

from jupyter_dist.common.process_group import read_lines, stop_group
from jupyter_dist.engine import workers

CHILD = "jupyter_dist.engine.script_child"  # run as `-m`: step hooks, then the script as __main__
STOP_GRACE_S = 5.0


def command(path: str, args: list[str], python: str = sys.executable) -> list[str]:
    return [python, "-m", CHILD, path, *args]


def child_env(env: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The rank's environment, with Python's output unbuffered (each line comes as printed)."""
    return {**env, "PYTHONUNBUFFERED": "1"}


def run(path: str, args: list[str]) -> int:
    """Run the script in a child process; its exit status (negative: the signal that ended it)."""
    proc = subprocess.Popen(command(path, args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=child_env(os.environ), start_new_session=True)
    workers.watch(proc.pid, CHILD)  # its resources and stacks are the rank's (engine/workers.py)
    try:
        stream(proc, {proc.stdout: sys.stdout, proc.stderr: sys.stderr})
        return proc.wait()
    except BaseException:
        stop_group(proc, STOP_GRACE_S)  # interrupted: the child goes with the cell
        raise
    finally:
        workers.forget(proc.pid)


def stream(proc: subprocess.Popen[bytes], sinks: dict[Any, IO[str]]) -> None:
    """Copy the child's pipes to `sinks` line by line as they come, until both close."""
    read_lines(sinks, _write)


def _write(line: str, sink: IO[str]) -> None:
    sink.write(line + "\n")
    sink.flush()
