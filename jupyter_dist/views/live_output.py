"""The live sink: a widget while a run goes, one static transcript when it ends.

`LiveTextSink` is `run.output.TextSink` with a live view (views/live.py's `RunView`): every
rank's output in arrival order, a tab per rank and the throughput chart, refreshed by timer
threads so that the kernel's main thread only hands lines on. `default_sink` is the sink the
session gets from `jupyter_dist.get_session()`.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
import time
from typing import Any

from IPython.display import publish_display_data

from jupyter_dist.common.channel import METRICS_LINE_PREFIX
from jupyter_dist.plan.layout import RankPlace
from jupyter_dist.run.display import RunDisplay
from jupyter_dist.run.output import OutputSink, RankLogs, TextSink, any_starts, shown_data
from jupyter_dist.views.kept_threads import VIEW_THREADS
from jupyter_dist.views.live import RunView, in_kernel
from jupyter_dist.views.ranks import ALL, OutputModel, render_html, transcript_parts
from jupyter_dist.views.resources_view import resources_svg
from jupyter_dist.views.run_display import NOTEBOOK
from jupyter_dist.views.svg_chart import metrics_svg

LIVE_POINTS = 300  # points per rank in a live resources panel (a long run's samples thinned)


class LiveTextSink(TextSink):
    """In a kernel: a live widget while the run goes (all ranks in arrival order, a tab per rank,
    the throughput chart), refreshed by a timer thread; at the end the widget closes and the
    output is printed once, grouped by rank, then the static chart and summary, so a saved
    notebook reads the same every time.

    The widget is shown on the first output (a line, a display, metrics) or once the run outlives
    SHOW_AFTER_S, not before: a warm cell of 20 ms that prints nothing gets no widget, no display
    message and no timer threads; its saved output is its transcript alone (nothing), as under `%%px`."""

    UPDATE_S = 0.25
    # the tab shown is redrawn every UPDATE_S, the hidden ones at most this often (32 ranks' tabs every
    # 0.25 s held the GIL the main thread and the sidebar's subshell wait for)
    HIDDEN_TABS_S = 2.0
    DRAW_SHARE = 20  # the text is redrawn at most every DRAW_SHARE x the last redraw's cost (<= 5% of the time)
    # a quiet run that outlives it shows the view (its status line; the ranks' resources come after ~1 s). Not less:
    # a warm `x = 1` on 32 ranks takes 0.15-0.3 s on 2 loaded cores, and the view of 33 tabs costs as much again
    SHOW_AFTER_S = 0.5
    KEEP_LINES_PER_RANK = 1000  # what the saved notebook keeps per rank (the log keeps all)
    LIVE_LINES = 200  # what a live tab shows
    CHART_S = 1.0  # the live chart is redrawn at most this often (and less when drawing is slow)
    RESOURCES_S = 2.0  # the resources panels likewise (their samples come about once a second)

    def __init__(self, charts: bool = True, run_display: RunDisplay = NOTEBOOK) -> None:
        super().__init__(charts, run_display)
        self.model = OutputModel(self.KEEP_LINES_PER_RANK)
        self.view: Any = None
        self._showing = False  # the view was made (or its making failed) for this run
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._loops: list[threading.Event] = []  # set once each timer loop of this run has returned
        self._t0 = time.monotonic()
        self._chart_at = 0.0
        self._chart_cost = 0.0
        self._chart_version = -1
        self._resources_version = -1
        self._resources_at = -1e9
        self._resources_cost = 0.0
        self._near_limit: list[str] = []
        self._frozen = False  # this run froze the kernel's objects (freeze_old_objects)
        self._hidden_at = 0.0  # when the tabs not shown were last redrawn

    def start(self, places: list[RankPlace], shown: tuple[int, ...] | None, logs: RankLogs) -> None:
        super().start(places, shown, logs)
        self.model = OutputModel(self.KEEP_LINES_PER_RANK, self.labels)
        self._shown_ranks = [p.rank for p in places if self._visible(p.rank)]
        for r in self._shown_ranks:
            self.model.rank(r)
        self.view = None
        self._showing = False
        self._t0 = time.monotonic()
        self._frozen = freeze_old_objects()

    def _show(self) -> None:
        """The live view and its timer threads, once per run (from the main thread: the runner's)."""
        if self._showing or self._stop.is_set():
            return
        self._showing = True
        with contextlib.suppress(Exception):  # a view glitch must never stop the run (shown from its loop)
            self.view = RunView(self._shown_ranks, "jupyter-dist: live output of the ranks")
        if self.view is not None and self.view.active:
            # text and chart on threads of their own: a chart takes 0.1-2 s to draw on a busy machine
            # (the first one imports matplotlib), and the text must keep streaming meanwhile. Threads kept
            # from run to run (views/kept_threads.py), at the normal priority: a thread at nice 19 that the OS
            # preempts while it holds the GIL holds it until its next time slice, on busy cores 0.1-0.4 s,
            # and the main thread and the sidebar's subshell wait for it
            self._loops = [VIEW_THREADS.run(self._text_loop), VIEW_THREADS.run(self._chart_loop)]

    def tick(self, elapsed: float) -> None:
        if self.view is None and elapsed >= self.SHOW_AFTER_S:
            self._show()

    def rank_failed(self, rank: int) -> None:
        """A failed run shows the view however fast it failed: a saved notebook's failed cell has the same
        outputs every time (a quiet run that ends within SHOW_AFTER_S has none, one that outlives it has it)."""
        self._show()

    def lines(self, rank: int, stream: str, lines: list[str]) -> None:
        if any_starts(lines, METRICS_LINE_PREFIX):  # a scan: a burst's lines cost no call each
            lines = [line for line in lines if not self.metrics.add_line(rank, line)]
        if not lines or not self._visible(rank):
            return
        self._show()
        with self._lock:
            self.model.lines(rank, stream, lines)

    def display(self, rank: int, content: dict[str, Any]) -> None:
        if not self._visible(rank):
            return
        self._show()
        with self._lock:
            self.model.display(rank, {"data": shown_data(content), "metadata": content.get("metadata", {})})

    def collected(self, rank: int, item: dict[str, Any]) -> None:
        self._show()
        with self._lock:
            super().collected(rank, item)

    def _text_loop(self) -> None:
        wait = self.UPDATE_S
        while not self._stop.wait(wait):
            t = time.monotonic()
            with contextlib.suppress(Exception):  # a view glitch must never stop the run
                self.refresh()
            wait = max(self.UPDATE_S, self.DRAW_SHARE * (time.monotonic() - t))

    def _chart_loop(self) -> None:
        while not self._stop.wait(self.UPDATE_S):
            with contextlib.suppress(Exception):  # a view glitch must never stop the run
                self.refresh_chart()
            with contextlib.suppress(Exception):
                self.refresh_resources()

    def refresh(self) -> None:
        """Push the text that changed to the widget (called by the timer thread, at most every
        UPDATE_S however fast lines come). The tails that changed are copied under the lock and
        drawn and sent outside it: the runner, which takes the lock to hand lines on, never waits
        for this low-priority thread's drawing."""
        view = self.view
        if view is None or not view.active:
            return
        selected = view.selected_key() if hasattr(view, "selected_key") else None
        now = time.monotonic()
        with self._lock:
            dirty = self.model.take_dirty()
            if selected is not None and now < self._hidden_at + self.HIDDEN_TABS_S:
                self.model.mark_dirty([key for key in dirty if key != selected])
                dirty = [key for key in dirty if key == selected]
            else:
                self._hidden_at = now
            changed = [(key, self.model.tails[key].last(self.LIVE_LINES)) for key in dirty if key in self.model.tails]
            shown = len(self.model.tails) - 1
        elapsed = time.monotonic() - self._t0
        near = "; near its memory limit: " + "; ".join(self._near_limit) if self._near_limit else ""
        view.set_status(f"running for {elapsed:.0f} s; {shown} rank(s) shown{near}")
        for key, tail in changed:
            view.set_html(key, render_html(tail, self.LIVE_LINES, self.model, labelled=key == ALL))

    def refresh_chart(self) -> bool:
        """Redraw the live chart (an SVG, views/svg_chart.py) when new metrics came and the throttle
        allows: from a copy taken under the lock, drawn outside it, so output keeps flowing. The
        measured cost counts the copy, which grows with the run."""
        view = self.view
        if view is None or not view.active:
            return False
        with self._lock:
            if self.metrics.version == self._chart_version or self.metrics.empty:
                return False
            if time.monotonic() - self._chart_at < max(self.CHART_S, 50 * self._chart_cost):  # <= 2% of a core
                return False
            t = time.monotonic()
            store, version = self.metrics.copy(), self.metrics.version
        svg = metrics_svg(store)
        self._chart_cost = time.monotonic() - t
        self._chart_at, self._chart_version = time.monotonic(), version
        if svg:
            view.set_chart(svg)
        return True

    def refresh_resources(self) -> bool:
        """Redraw every rank's resources when new samples came, at most every RESOURCES_S and at
        most 2% of a core (the draw's measured cost), each series thinned to what the panel shows."""
        view = self.view
        if view is None or not view.active or self.resources.version == self._resources_version:
            return False
        if time.monotonic() - self._resources_at < max(self.RESOURCES_S, 50 * self._resources_cost):
            return False
        t = time.monotonic()
        self._resources_version = self.resources.version
        self._near_limit = self.resources.near_limit()
        svg = resources_svg(self.resources, max_points=LIVE_POINTS)
        if svg:
            view.set_resources(svg)
        self._resources_at = time.monotonic()
        self._resources_cost = self._resources_at - t
        return True

    def finish(self) -> None:
        if self._frozen:  # the output is all in: the kernel's objects are the collector's again
            self._frozen = False
            gc.unfreeze()
        self._stop.set()
        for done in self._loops:
            done.wait(5)
        with self._lock:
            if self.view is not None:
                self.view.close()
            self.model.settle()
            self.print_transcript()
        super().finish()

    def transcript(self) -> str:
        """The static transcript as text (displays shown by their text/plain)."""
        return "\n".join(p if isinstance(p, str) else f"{p[0]} display: {p[1]['data'].get('text/plain', '')}"
                         for p in transcript_parts(self.model, self.logs))

    def print_transcript(self) -> None:
        text: list[str] = []
        for part in transcript_parts(self.model, self.logs):
            if isinstance(part, str):
                text.append(part)
                continue
            label, content = part
            text.append(f"{label} display:")
            sys.stdout.write("\n".join(text) + "\n")
            sys.stdout.flush()
            text = []
            publish_display_data(content["data"], content.get("metadata") or {})
        if text:
            sys.stdout.write("\n".join(text) + "\n")
            sys.stdout.flush()


def freeze_old_objects() -> bool:
    """Move every object the kernel holds now out of the garbage collector's reach until the run ends
    (`gc.freeze`; `finish` unfreezes): a full collection during a burst then traverses what the run made,
    not the whole kernel, and holds the GIL (the sidebar's subshell, the view's thread) that much shorter.
    Not when something else froze objects already: its freeze is not ours to undo."""
    if gc.get_freeze_count():
        return False
    gc.freeze()
    return True


def default_sink() -> OutputSink:
    """The live display in a kernel, plain labelled lines elsewhere (terminal IPython, tests)."""
    return LiveTextSink() if in_kernel() else text_sink()


def text_sink() -> TextSink:
    """Plain labelled lines, and the notebook's charts at the end."""
    return TextSink(run_display=NOTEBOOK)
