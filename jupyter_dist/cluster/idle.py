"""Work for the time between cells: run on the kernel's own loop once the cell has ended.

After a run the cluster tends its warm spare engine (`replacement.tend`: an `mpiexec` launched,
a rank's agent asked what it imported), about a second the cell itself need not wait for: the first
cell of a fresh kernel counted it. In a kernel the cell runs inside the kernel's asyncio loop, so the
work is scheduled there and runs in the same (main) thread once the cell is done and the kernel
idle, never beside a cell. Where no loop runs (a terminal IPython, a test's shell) it runs now.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

DELAY_S = 0.05


def when_idle(work: Callable[[], None]) -> bool:
    """Run `work` after the current cell (on the running loop); now where none runs. True when deferred."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is None or loop.is_closed():
        with contextlib.suppress(Exception):  # a convenience: never fails the caller
            work()
        return False

    def guarded() -> None:
        with contextlib.suppress(Exception):
            work()

    loop.call_later(DELAY_S, guarded)
    return True
