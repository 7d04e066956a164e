"""A live area in the cell output: an ipywidget updated over its comm while a run goes.

Comm updates are not output messages, so nothing of the live state lands in the saved
notebook; what stays is what the caller prints or displays once the run is over.
"""

from __future__ import annotations

import contextlib
import html
from typing import Any

from IPython import get_ipython
from IPython.display import display

from jupyter_dist.views.ranks import ALL


def in_kernel() -> bool:
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def close_widgets(widgets: list[Any]) -> None:
    """Close each widget with its style and layout (their own comms), each once, whatever fails."""
    seen: set[int] = set()
    for w in widgets:
        for part in (getattr(w, "style", None), getattr(w, "layout", None), w):
            if part is not None and id(part) not in seen and hasattr(part, "close"):
                seen.add(id(part))
                with contextlib.suppress(Exception):
                    part.close()


class LiveArea:
    """A `<pre>` block that can be rewritten in place; a no-op outside a kernel."""

    def __init__(self, placeholder: str = "jupyter-dist: live output") -> None:
        self.widget: Any = None
        if not in_kernel():
            return
        try:
            import ipywidgets as widgets  # optional, and heavy: only in a kernel, when a run starts
        except ImportError:
            return
        self.widget = widgets.HTML(value="")
        bundle = {
            "application/vnd.jupyter.widget-view+json": {
                "version_major": 2, "version_minor": 0, "model_id": self.widget.model_id,
            },
            "text/plain": placeholder,
        }
        display(bundle, raw=True)

    @property
    def active(self) -> bool:
        return self.widget is not None

    def set_text(self, text: str) -> None:
        if self.widget is not None:
            self.widget.value = f"<pre style='margin:0;max-height:30em;overflow:auto'>{html.escape(text)}</pre>"

    def close(self) -> None:
        """Empty, then close: a headless run keeps the last state of every widget (see RunView.close)."""
        if self.widget is not None:
            with contextlib.suppress(Exception):
                self.widget.value = ""
                self.widget.layout.display = "none"
            close_widgets([self.widget])
            self.widget = None


class RunParts:
    """The widgets inside a live view (status line, tabs, chart, resources): made once for a set of
    tabs and kept, hidden and empty, for the next run with the same tabs. Each widget is a comm opened
    and closed: 18 of them per run at 4 ranks, most of a warm trivial cell's time in the kernel."""

    _kept: RunParts | None = None  # the last run's, while idle

    def __init__(self, keys: tuple[int, ...]) -> None:
        import ipywidgets as widgets  # optional, and heavy: only in a kernel, when a run starts
        from ipywidgets.widgets.widget_string import HTMLStyle  # optional, heavy (as above)

        self.keys = keys
        # one layout and one style for the text widgets, not a pair each
        shared = {"layout": widgets.Layout(), "style": HTMLStyle()}
        self.html = {k: widgets.HTML(value="", **shared) for k in keys}
        if len(keys) == 1:
            self.body: Any = self.html[keys[0]]
        else:
            self.body = widgets.Tab(children=[self.html[k] for k in keys])
            self.body.titles = tuple(["all ranks"] + [f"rank {r}" for r in keys[1:]])
        self.status = widgets.HTML(value="", **shared)
        # an inline SVG (views/svg_chart.py): drawing it costs the ranks far less CPU than a PNG
        self.chart = widgets.HTML(value="", layout=widgets.Layout(display="none", max_width="100%"), style=shared["style"])
        self.resources = widgets.HTML(value="", layout=widgets.Layout(display="none", max_width="100%"),
                                      style=shared["style"])
        self.charts = widgets.HBox([self.chart, self.resources], layout=widgets.Layout(flex_flow="row wrap"))
        self.widgets = [self.body, self.status, self.charts, self.chart, self.resources, *self.html.values()]

    @classmethod
    def take(cls, keys: tuple[int, ...]) -> RunParts:
        """The kept parts if they have these tabs (the others closed), else new ones."""
        kept, cls._kept = cls._kept, None
        if kept is not None and kept.keys == keys:
            return kept
        if kept is not None:
            close_widgets(kept.widgets)
        return cls(keys)

    def give_back(self) -> None:
        """Hidden and empty (a headless run saves every live widget's last state, and an HTML report
        draws it), then kept for the next run."""
        with contextlib.suppress(Exception):
            for w in (self.chart, self.resources):
                w.value = ""
                w.layout.display = "none"
            self.status.value = ""
            for w in self.html.values():
                w.value = ""
            RunParts._kept = self


class RunView:
    """The live view of one run: a status line, a tab for all ranks and one per rank, and the
    throughput chart (hidden until metrics arrive). Tabs switch in the browser, so they work
    while the kernel is busy with the run; the kernel only pushes the tabs that changed.

    One display message, whatever the cell does, so the saved notebook has the same outputs
    every time. A no-op outside a kernel.
    """

    MAX_TABS = 64

    def __init__(self, ranks: list[int], placeholder: str = "jupyter-dist: live output") -> None:
        self.box: Any = None
        self.html: dict[int, Any] = {}
        self.chart: Any = None
        self.resources: Any = None  # every rank's CPU, memory and GPU, beside the chart
        self.status: Any = None
        if not in_kernel():
            return
        try:
            import ipywidgets as widgets  # optional, and heavy: only in a kernel, when a run starts
        except ImportError:
            return
        keys = [ALL, *ranks[: self.MAX_TABS]] if len(ranks) > 1 else list(ranks[:1]) or [ALL]
        # the parts are kept from the last run with the same tabs; only the box around them is new
        # (the last run's cell keeps its closed box, which draws nothing)
        self.parts = RunParts.take(tuple(keys))
        self.html = dict(self.parts.html)
        if len(ranks) == 1:
            self.html[ALL] = self.parts.body  # the one rank's view is also "all"
        self.status, self.chart, self.resources = self.parts.status, self.parts.chart, self.parts.resources
        self.status.value = "<span style='opacity:.7'>jupyter-dist: starting the run</span>"
        self.box = widgets.VBox([self.status, self.parts.body, self.parts.charts])
        bundle = {
            "application/vnd.jupyter.widget-view+json": {
                "version_major": 2, "version_minor": 0, "model_id": self.box.model_id,
            },
            "text/plain": placeholder,
        }
        display(bundle, raw=True)

    @property
    def active(self) -> bool:
        return self.box is not None

    def selected_key(self) -> int | None:
        """The key of the tab the notebook shows (as the browser last synced it), or None when there
        are no tabs (one text widget, always shown)."""
        keys = self.parts.keys if self.box is not None else ()
        index = getattr(self.parts.body, "selected_index", None) if len(keys) > 1 else None
        return keys[index] if index is not None and 0 <= index < len(keys) else None

    def set_html(self, key: int, value: str) -> None:
        w = self.html.get(key)
        if w is not None and w.value != value:
            w.value = value

    def set_status(self, text: str) -> None:
        if self.status is not None:
            self.status.value = f"<span style='opacity:.7'>jupyter-dist: {html.escape(text)}</span>"

    def set_chart(self, svg: str) -> None:
        """Show the chart, an `<svg>` element as text (hidden until the first one)."""
        if self.chart is not None:
            self.chart.value = svg
            self.chart.layout.display = None

    def set_resources(self, svg: str) -> None:
        """Show every rank's resources, an `<svg>` element as text (hidden until the first samples)."""
        if self.resources is not None:
            self.resources.value = svg
            self.resources.layout.display = None

    def close(self) -> None:
        """Hide the view and close its box; its parts, emptied, are kept for the next run. A notebook
        executed headless (nbconvert) keeps every widget's last state, closed or not, and an HTML report
        draws it: hidden and empty, it draws nothing and stores no stale copy beside the static output."""
        if self.box is None:
            return
        with contextlib.suppress(Exception):
            self.box.layout.display = "none"
        self.parts.give_back()
        close_widgets([self.box])
        self.box = self.chart = self.resources = self.status = None
        self.html = {}
