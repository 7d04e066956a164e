"""The controller's heartbeat: how soon a started engine counts as registered, and when a silent one is dead.

ipyparallel's Hub completes an engine's registration only once its heart has answered a ping, and it reads
the answers at its next beat (`HeartMonitor.beat`): with the default period of 3 s every engine start is
rounded up to the next 3 s tick or the one after (a 4-rank start measured 6.00-6.01 s in every run, fork on
or off). A quarter-second period ends that rounding. The Hub declares an engine dead after
`max_heartmonitor_misses` silent periods: the misses are scaled so that this stays the default's 30 s, and
the engines' own check (`IPEngine.max_heartbeat_misses`, periods of `period + 0.5 s`) keeps its 50 checks.

The cost is a ping every period to each engine, answered by its heart's zmq device thread (C, no GIL), and
one Python callback per ping on the engine's loop and in the controller: a few microseconds each.
"""

from __future__ import annotations

PERIOD_MS = 250
SILENT_S = 30  # ipyparallel's default: 10 misses of 3 s


def controller_args() -> list[str]:
    misses = max(1, SILENT_S * 1000 // PERIOD_MS)
    return [f"--HeartMonitor.period={PERIOD_MS}", f"--HeartMonitor.max_heartmonitor_misses={misses}"]
