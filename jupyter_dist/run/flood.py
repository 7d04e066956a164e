"""When the ranks' output floods the kernel: a drain handed on FLOOD_CHARS or more, or fell behind (left
text for the next: the runner's backlog), and until CALM_S pass without such a drain. The runner tells the
cluster after every drain, which lets a crowded node's engines weigh less meanwhile
(cluster/session_weight.py). A run printing a line an epoch, or 32 progress bars redrawn ten times a
second (about 300 characters a drain), never floods it; a burst of 100,000 lines over 32 ranks sends
about 40,000 characters a drain and does from its first."""

from __future__ import annotations

from collections.abc import Callable

FLOOD_CHARS = 1 << 14  # characters one drain hands on (it runs every 10 ms while output flows)
CALM_S = 1.0  # a flood ends this long after the last drain that was one


class FloodWatch:
    """`tell(on)` after every drain: on from a flooding drain until CALM_S without one; off at `end`."""

    def __init__(self, tell: Callable[[bool], None]) -> None:
        self.tell = tell
        self._last: float | None = None  # monotonic time of the last flooding drain

    def after_drain(self, backlog: bool, chars: int, now: float) -> None:
        if backlog or chars >= FLOOD_CHARS:
            self._last = now
        self.tell(self._last is not None and now - self._last < CALM_S)

    def end(self) -> None:
        self._last = None
        self.tell(False)
