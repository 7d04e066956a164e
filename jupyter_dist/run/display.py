"""What a run shows besides the ranks' output: charts at its end, the engines' start-up progress.

`run` draws nothing itself: the views implement `RunDisplay` (views/run_display.py) and are handed
to the session and its sinks by `jupyter_dist.get_session()`. `PlainDisplay` is the text-only
stand-in where nothing was handed in (a bare `DistSession()`, a script, a test).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from jupyter_dist.run.metrics_store import MetricsStore, ScalingResult
from jupyter_dist.run.resources import ResourceStore

# (engines registered, engines expected, seconds since the start)
Progress = Callable[[int, int, float], None]


class RunDisplay(Protocol):
    def metrics(self, store: MetricsStore) -> None:
        """The end of a run that sent metrics: its chart, then the summary."""

    def scaling(self, result: ScalingResult) -> None:
        """The end of a `--scaling` run: throughput against ideal linear scaling, then the table."""

    def start_progress(self) -> Progress:
        """A callback told how many engines registered while they start."""

    def resources(self, store: ResourceStore) -> None:
        """The end of a run: every rank's CPU, memory and GPU over the run, then one line per rank."""


def engines_started(n: int, elapsed: float) -> str:
    return f"jupyter-dist: {n} engines started in {elapsed:.1f} s"


class PlainDisplay:
    """Text only: the summaries and the start-up's last line, no charts."""

    def metrics(self, store: MetricsStore) -> None:
        print("\n".join(store.summary().lines()), flush=True)

    def scaling(self, result: ScalingResult) -> None:
        print("\n".join(result.lines()), flush=True)

    def resources(self, store: ResourceStore) -> None:
        print("\n".join(["jupyter-dist: resources per rank", *store.summary_lines()]), flush=True)

    def start_progress(self) -> Progress:
        done: list[bool] = []

        def progress(up: int, n: int, elapsed: float) -> None:
            if up == n and not done:
                done.append(True)
                print(engines_started(n, elapsed), flush=True)

        return progress
