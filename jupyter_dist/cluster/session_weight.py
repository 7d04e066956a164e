"""A crowded node's engines weigh less while their output floods the kernel (their session's autogroup nice).

On a crowded node (common/crowding.py) the ranks share one session, the fork server's (engine/sessions.py),
which Linux weighs as much as the notebook kernel's session. During a burst of output the kernel's threads
want a core in many short turns, and a session that mostly sleeps gets little weight on each core (the
scheduler splits a session's weight by its recent load there): `perf sched timehist` showed the kernel's
threads runnable and not run for 0.4-0.6 s while 32 printing ranks ran, and a subshell's `1` waited as long
(benchmarks/README.md, "Seventeenth session"). At nice FLOOD_NICE the ranks' session weighs a tenth of the
kernel's while the flood lasts, and goes back to what it was once the output calms down, so a quiet cell's
dispatch and a long run's training share the cores as before.

The kernel can only tell a flood from the drains it runs, and a burst starved it before its first drains
were big: in 5 bursts of 26 the raise came 0.7-1.3 s in, and a subshell waited 0.3-0.8 s meanwhile.
So a rank that starts flooding raises its session itself (engine/flood_signal.py); `raised_by_ranks` lets
the kernel's watch take that as a flood it saw, which it sets back once the output calms down or the run ends.

Raising a nice needs no privilege, nor does setting it back (only a nice below 0 does); Linux takes one
change per 0.1 s machine-wide from processes without CAP_SYS_ADMIN (EAGAIN), so a refused change is tried
again at the next call, and a refused return to the base from a timer. `JUPYTER_DIST_FLOOD_NICE=N` in the
kernel's environment (the engines inherit it) sets the level, `0` turns it off (common/flood_level.py).
"""

from __future__ import annotations

import errno
import threading
import time

from jupyter_dist.common.autogroup import autogroup_path, parse_nice, write_nice
from jupyter_dist.common.flood_level import flood_nice

RETRY_S = 0.15  # Linux's limit is one change per 0.1 s
REREAD_S = 0.2  # how often a weight at its base looks whether the ranks raised it themselves


class SessionWeight:
    """The autogroup nice of the session that process `pid` leads: its base (read once), or `nice` while
    flooded. `flooded` is cheap when nothing changes; it is called from the notebook's main thread."""

    def __init__(self, pid: int, nice: int | None = None) -> None:
        self.path = autogroup_path(pid)
        try:
            with open(self.path) as f:
                self.base = parse_nice(f.read())
        except OSError:  # a kernel without autogroups
            self.base = None
        self.nice = flood_nice() if nice is None else nice
        self._have = self._want = self.base
        self._refused = -RETRY_S  # monotonic time of the last EAGAIN
        self._looked = -REREAD_S  # monotonic time of the last look at what the session has
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        """Whether a flood changes anything here (autogroups, and a level above the base)."""
        return self.base is not None and self.nice > self.base

    @property
    def current(self) -> int | None:
        """The nice last set (the base until a flood)."""
        return self._have

    def flooded(self, on: bool) -> None:
        """The ranks' session at `nice` (on) or back at its base; a refused change is tried again at the
        next call at most every RETRY_S, and the return to the base also from a timer."""
        if not self.active:
            return
        with self._lock:
            self._want = self.nice if on else self.base
            if self._want == self._have:
                return
            # refused a moment ago: Linux would refuse it again (the next call comes soon, or the timer)
            refused = time.monotonic() - self._refused < RETRY_S or self._write() == errno.EAGAIN
        if refused and not on:
            self._retry_later()

    def raised_by_ranks(self, force: bool = False) -> bool:
        """Whether the ranks raised their session themselves (engine/flood_signal.py) while this weight had
        it at its base: then it counts as raised here, for the next `flooded(False)` to set back. Looked at
        (one read of a /proc file) at most every REREAD_S, unless `force` (a run's end)."""
        if not self.active:
            return False
        now = time.monotonic()
        with self._lock:
            if self._have != self.base or self._want != self.base or (not force and now - self._looked < REREAD_S):
                return False
            self._looked = now
            try:
                with open(self.path) as f:
                    have = parse_nice(f.read())
            except OSError:
                return False
            if have is None or have == self.base:
                return False
            self._have = have
            return True

    def _write(self) -> int:
        """0 when set, else the errno (the session gone: ESRCH or ENOENT, given up)."""
        err = write_nice(self.path, self._want)
        if err == errno.EAGAIN:
            self._refused = time.monotonic()
        else:
            self._have = self._want  # set, or nothing more to do for a session that is gone
        return err

    def _retry_later(self) -> None:
        if self._timer is not None and self._timer.is_alive():
            return
        self._timer = threading.Timer(RETRY_S, self._retry)
        self._timer.daemon = True
        self._timer.start()

    def _retry(self) -> None:
        for _ in range(100):  # 15 s at most: another process may be changing niced sessions just as often
            with self._lock:
                if self._want == self._have or self._write() != errno.EAGAIN:
                    return
            time.sleep(RETRY_S)
