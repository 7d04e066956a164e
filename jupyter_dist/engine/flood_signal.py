"""A crowded node's rank that starts flooding the notebook with output makes its session lighter itself.

The kernel makes the ranks' session lighter while their output floods it (cluster/session_weight.py), but it
can only tell from the drains it runs, and a burst of 32 ranks starves it before they are big: in 5 bursts
of 26 the raise came 0.7-1.3 s in, and the notebook's subshell waited 0.3-0.8 s meanwhile
(benchmarks/README.md, "Nineteenth session"). A rank is running then. So in a %%distrun cell, once a rank
has printed RANK_FLOOD_CHARS within WINDOW_S, it sets its session's autogroup nice to the flood level
(common/flood_level.py), once a cell; the kernel's watch takes that as a flood it saw and sets the session
back once the output calms down, or at the run's end. Only where the node is crowded and the ranks share
their fork server's session (engine/sessions.py): a session of the rank's own is never changed here.

Counted by wrapping the rank's `sys.stdout.write`/`sys.stderr.write`, at the first such cell (a rank of a
node that is not crowded is never wrapped); outside an armed cell the wrapper is one attribute test.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from jupyter_dist.common.autogroup import autogroup_path, parse_nice, write_nice
from jupyter_dist.common.crowding import crowded
from jupyter_dist.common.flood_level import flood_nice
from jupyter_dist.engine import cells
from jupyter_dist.engine.sessions import ranks_on_node

RANK_FLOOD_CHARS = 8 << 10  # one rank's text within WINDOW_S: a flood's start (32 ranks: 1 MB/s in all)
WINDOW_S = 0.25


class FloodSignal:
    """Counts what a rank writes in an armed cell, by windows of WINDOW_S; calls `lighten` once when a
    window holds RANK_FLOOD_CHARS."""

    def __init__(self, lighten: Callable[[], None], chars: int = RANK_FLOOD_CHARS, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lighten, self.chars, self.window_s, self.clock = lighten, chars, window_s, clock
        self.armed = False
        self._count = 0
        self._since = 0.0

    def arm(self) -> None:
        self.armed, self._count, self._since = True, 0, self.clock()

    def disarm(self) -> None:
        self.armed = False

    def wrote(self, n: int) -> None:
        now = self.clock()
        if now - self._since > self.window_s:
            self._count, self._since = 0, now
        self._count += n
        if self._count >= self.chars:
            self.armed = False
            self.lighten()


def shares_a_crowded_session() -> bool:
    """Whether this rank is in its parent's session (the fork server's) on a crowded node."""
    try:
        return os.getsid(0) == os.getppid() and crowded(ranks_on_node(), len(os.sched_getaffinity(0)))
    except OSError:
        return False


def lighten_session(level: int | None = None) -> None:
    """This rank's session at the flood level, unless it is there already (another rank was first)."""
    level = flood_nice() if level is None else level
    path = autogroup_path()
    try:
        with open(path) as f:
            have = parse_nice(f.read())
    except OSError:
        return
    if have is not None and have < level:
        write_nice(path, level)  # refused (EAGAIN): another rank's change just landed, or the kernel watches


SIGNAL = FloodSignal(lighten_session)


def counted(write: Callable[[str], Any], signal: FloodSignal = SIGNAL) -> Callable[[str], Any]:
    """`write`, counting the text of an armed cell into `signal`."""
    def write_counted(text: str) -> Any:
        if signal.armed:
            signal.wrote(len(text))
        return write(text)

    write_counted.flood_counted = True  # type: ignore[attr-defined]
    return write_counted


def count_streams() -> None:
    """This rank's stdout and stderr counted into SIGNAL (once: a wrapped `write` is left as it is)."""
    for stream in (sys.stdout, sys.stderr):
        if not getattr(getattr(stream, "write", None), "flood_counted", False):
            stream.write = counted(stream.write)


def _arm(code: str) -> None:
    if cells.distrun_cell() and flood_nice() > 0 and shares_a_crowded_session():
        count_streams()
        SIGNAL.arm()


def _disarm() -> None:
    SIGNAL.disarm()


def register() -> None:
    """Watch this rank's %%distrun cells for a flood's start (once per engine)."""
    cells.add_hook(cells.BEFORE_CELL, _arm)
    cells.add_hook(cells.END_OF_CELL, _disarm)
