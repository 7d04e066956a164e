"""Every rank's stack and collective, taken from the ranks' agents at once; the last one kept.

`%dist stacks`, the sidebar's Stacks button and a `--timeout` report take one `StacksReport`
through `take` (thread-safe: the sidebar asks from a kernel subshell while the cell runs on the
main thread). `RankReports.last` keeps the last report taken, so that after a failed or timed-out
run (engines restarted, stacks gone) `%dist stacks` still shows what the ranks were doing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from jupyter_dist.cluster.agents import RankAgents
from jupyter_dist.run.desync import desync_lines, records_by_rank
from jupyter_dist.run.stacks import by_rank, group, headline, is_library, main_frames, render


@dataclass(frozen=True)
class StacksReport:
    """What the ranks answered at `taken` (time.time()), and how long the asking took."""

    taken: float
    stacks: dict[int, Any]
    collectives: dict[int, Any]
    missing: dict[int, str]
    took: float = 0.0
    world: tuple[int, ...] = ()

    @property
    def busy(self) -> bool:
        """Some rank stood in the user's code or in a collective (not every engine idle)."""
        return any(c.get("in_flight") for c in self.collectives.values()) or any(
            not is_library(f) for threads in self.stacks.values() for f in main_frames(threads))

    def headline(self) -> str:
        return headline(group(self.stacks))

    def collective_lines(self) -> list[str]:
        return desync_lines(self.collectives, self.stacks, self.world)

    def lines(self) -> list[str]:
        """The collectives first (the mismatch is what a person looks for), then the stacks grouped."""
        return [*self.collective_lines(), *render(group(self.stacks), self.missing)]

    def text(self, title: str = "") -> str:
        head = title or f"stacks of {len(self.world) or len(self.stacks)} ranks (answered in {self.took * 1000:.0f} ms)"
        return "\n".join([head, *self.lines()])


def take(agents: RankAgents, ranks: Iterable[int] | None = None, timeout: float = 1.0) -> StacksReport:
    """Ask every rank's agent for its stacks and its collectives, both at once, within `timeout`."""
    wanted = sorted(agents.addresses if ranks is None else ranks)
    t0 = time.monotonic()
    got: dict[str, Any] = {}

    def ask(op: str) -> None:
        got[op] = agents.ask(op, wanted, timeout=timeout)

    other = threading.Thread(target=ask, args=("collectives",), daemon=True)
    other.start()
    ask("stacks")
    other.join(timeout + 1.0)
    stacks, collectives = got["stacks"], got.get("collectives")
    by = by_rank(stacks.results)  # a worker's stack as its rank's (--fresh, torchrun)
    return StacksReport(
        taken=time.time(),
        stacks=by,
        collectives=records_by_rank(collectives.results) if collectives is not None else {},  # workers' too
        missing={r: why for r, why in stacks.missing.items() if r not in by},
        took=time.monotonic() - t0,
        world=tuple(wanted),
    )


@dataclass
class RankReports:
    """The session's last report: `%dist stacks` shows it when the ranks cannot answer any more."""

    last: StacksReport | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take(self, agents: RankAgents, timeout: float = 1.0) -> StacksReport | None:
        """A fresh report, kept; None when no rank has an agent (no cluster)."""
        if not agents.addresses:
            return None
        report = take(agents, timeout=timeout)
        if report.busy:
            self.keep(report)
        return report

    def keep(self, report: StacksReport) -> None:
        """Keep `report` as the last one (the timeout report calls this with what it took)."""
        with self._lock:
            self.last = report

    def text(self, agents: RankAgents, timeout: float = 1.0) -> str:
        """`%dist stacks`: the ranks now; when they are all idle (the run over, failed or timed out)
        or cannot answer, the last stacks taken while they ran, said as such."""
        report = self.take(agents, timeout)
        last = self.last
        if report is not None and (report.busy or last is None):
            return report.text()
        if last is None:
            return "jupyter-dist: no cluster is running and no stacks were taken yet; %%distrun starts one."
        now = "idle now" if report is not None else "gone now"
        when = time.strftime("%H:%M:%S", time.localtime(last.taken))
        return last.text(f"the last stacks taken while the ranks ran, at {when} (the ranks are {now}):")
