"""Children in a process group of their own: the kernel's launchers and a node's torchrun use it."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import IO, Any, TypeVar

T = TypeVar("T")


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


def read_lines(pipes: dict[IO[bytes], T], on_line: Callable[[str, T], None]) -> None:
    """Read a child's pipes as they come, line by line, until all close: `on_line(line, pipes[pipe])`
    for each line (without its newline; a last line without one too)."""
    sel = selectors.DefaultSelector()
    pending: dict[Any, bytes] = {}
    for pipe in pipes:
        os.set_blocking(pipe.fileno(), False)
        sel.register(pipe, selectors.EVENT_READ)
        pending[pipe] = b""
    try:
        while pending:
            for key, _ in sel.select(timeout=0.2):
                pipe = key.fileobj
                chunk = os.read(pipe.fileno(), 65536)  # type: ignore[union-attr]
                if not chunk:
                    sel.unregister(pipe)
                    rest = pending.pop(pipe)
                    if rest:
                        on_line(rest.decode(errors="replace"), pipes[pipe])  # type: ignore[index]
                    continue
                *lines, pending[pipe] = (pending[pipe] + chunk).split(b"\n")
                for line in lines:
                    on_line(line.decode(errors="replace"), pipes[pipe])  # type: ignore[index]
    finally:
        sel.close()
