"""The notebook's `RunDisplay` (run/display.py): static charts at the end of a run, live start-up progress."""

from __future__ import annotations

from typing import Any

from jupyter_dist.run.display import Progress, engines_started
from jupyter_dist.run.metrics_store import MetricsStore, ScalingResult
from jupyter_dist.run.resources import ResourceStore
from jupyter_dist.views import charts
from jupyter_dist.views.live import LiveArea
from jupyter_dist.views.resources_view import show_resources


class NotebookDisplay:
    """Charts as images that stay in the saved notebook; the start-up progress in a live area."""

    def metrics(self, store: MetricsStore) -> None:
        charts.show_metrics(store)

    def scaling(self, result: ScalingResult) -> None:
        charts.show_scaling(result)

    def resources(self, store: ResourceStore) -> None:
        show_resources(store)

    def start_progress(self) -> Progress:
        """'starting engines: 3/4 registered (2.1 s)' live while engines come up, then one line."""
        state: dict[str, Any] = {}

        def progress(up: int, n: int, elapsed: float) -> None:
            if "area" not in state:
                state["area"] = LiveArea("jupyter-dist: starting engines")
            text = f"jupyter-dist: starting engines: {up}/{n} registered ({elapsed:.1f} s)"
            state["area"].set_text(text)
            if up == n and not state.get("done"):
                state["done"] = True
                state["area"].close()
                print(engines_started(n, elapsed), flush=True)

        return progress


NOTEBOOK = NotebookDisplay()
