"""When the ranks' output floods the kernel: a drain handed on FLOOD_CHARS or more, or fell behind (left
text for the next: the runner's backlog), or the ranks raised their session themselves on starting a
flood (engine/flood_signal.py: the kernel, starved, may not drain in time to tell); and until CALM_S
pass without such a drain. The runner tells the cluster after every drain, which lets a crowded node's
engines weigh less meanwhile (cluster/session_weight.py). A run printing a line an epoch, or 32 progress
bars redrawn ten times a second (about 300 characters a drain), never floods it; a burst of 100,000
lines over 32 ranks sends about 40,000 characters a drain and does from its first."""

from __future__ import annotations

from typing import Protocol

FLOOD_CHARS = 1 << 14  # characters one drain hands on (it runs every 10 ms while output flows)
CALM_S = 1.0  # a flood ends this long after the last drain that was one


class FloodTarget(Protocol):
    """What the watch tells (the cluster: cluster/engines.py)."""

    def set_output_flood(self, on: bool) -> None: ...

    def output_flood_raised(self, force: bool = False) -> bool: ...


class FloodWatch:
    """`after_drain` after every drain: on from a flooding drain until CALM_S without one; off at `end`."""

    def __init__(self, target: FloodTarget) -> None:
        self.target = target
        self._last: float | None = None  # monotonic time of the last flooding drain

    def on(self, now: float) -> bool:
        return self._last is not None and now - self._last < CALM_S

    def after_drain(self, backlog: bool, chars: int, now: float) -> None:
        if backlog or chars >= FLOOD_CHARS or (chars and not self.on(now) and self.target.output_flood_raised()):
            self._last = now
        self.target.set_output_flood(self.on(now))

    def end(self) -> None:
        """The run is over: its ranks' session back at its base, a raise of theirs after the last look too."""
        self._last = None
        self.target.output_flood_raised(force=True)
        self.target.set_output_flood(False)
