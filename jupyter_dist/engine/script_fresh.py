"""`%distrun --fresh script.py`: the script in a new child process of each rank's engine.

Where a warm re-run cannot be made clean (a framework that keeps state no reset reaches, a C
extension's global, a script that leaves threads or `atexit` work), a process of its own is the
honest answer. The child gets the rank's environment and working folder; its output streams into
the rank's output line by line; its `report()` batches and counted optimizer steps come as metric
lines (common.channel's METRICS_LINE_PREFIX), which the notebook takes out of the output; its exit
status is the rank's. On rank 0 its `input()` and `sys.stdin` ask the notebook through the engine
(engine.stdin_relay); the other ranks' stdin is empty (EOF), as under `mpirun`. An interrupt of the
engine stops it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from functools import partial
from typing import IO, Any

from jupyter_dist.common.process_group import read_lines, stop_group
from jupyter_dist.engine import script_input, stdin_relay, worker_collectives, workers

CHILD = "jupyter_dist.engine.script_child"  # run as `-m`: step hooks, then the script as __main__
STOP_GRACE_S = 5.0


def command(path: str, args: list[str], python: str = sys.executable) -> list[str]:
    return [python, "-m", CHILD, path, *args]


def child_env(env: dict[str, str] | os._Environ[str], asks: bool = False) -> dict[str, str]:
    """The rank's environment, with Python's output unbuffered (each line comes as printed); `asks`:
    the child's input() asks the engine (rank 0)."""
    return {**env, "PYTHONUNBUFFERED": "1", **({stdin_relay.RELAY_VAR: "1"} if asks else {})}


def run(path: str, args: list[str]) -> int:
    """Run the script in a child process; its exit status (negative: the signal that ended it)."""
    asks = script_input.my_rank() == 0
    env = {**child_env(os.environ, asks), **worker_collectives.env_for_workers()}  # it answers for its collectives
    proc = subprocess.Popen(command(path, args), stdin=subprocess.PIPE if asks else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)
    workers.watch(proc.pid, CHILD)  # its resources and stacks are the rank's (engine/workers.py)
    try:
        with script_input.asking_notebook(0 if asks else -1):
            stream(proc, {proc.stdout: sys.stdout, proc.stderr: sys.stderr})
        return proc.wait()
    except BaseException:
        stop_group(proc, STOP_GRACE_S)  # interrupted: the child goes with the cell
        raise
    finally:
        workers.forget(proc.pid)


def stream(proc: subprocess.Popen[bytes], sinks: dict[Any, IO[str]]) -> None:
    """Copy the child's pipes to `sinks` line by line as they come, until both close; a line that
    asks for input is answered on the child's stdin instead."""
    read_lines(sinks, partial(_line, proc))


def _line(proc: subprocess.Popen[bytes], line: str, sink: IO[str]) -> None:
    prompt = stdin_relay.prompt_of(line) if proc.stdin is not None else None
    if prompt is None:
        sink.write(line + "\n")
        sink.flush()
        return
    with contextlib.suppress(OSError, ValueError):  # the child may be gone, or its stdin closed
        try:
            text = script_input.ask_notebook(prompt)
        except EOFError:
            proc.stdin.close()
            return
        proc.stdin.write((text + "\n").encode())
        proc.stdin.flush()
