"""Output views without processes: line assembly, logs, the sinks (with a fake widget view), charts."""

from __future__ import annotations

import re
import time

import pytest

from jupyter_dist.engine.metrics import LINE_PREFIX
from jupyter_dist.plan.layout import RankPlace
from jupyter_dist.run.display import PlainDisplay
from jupyter_dist.run.metrics_store import MetricsStore, ScalingPoint, scaling_result
from jupyter_dist.run.output import LineBuffer, RankLogs, TextSink, settle
from jupyter_dist.views import charts, live_output, ranks
from jupyter_dist.views.live_output import LiveTextSink
from jupyter_dist.views.ranks import ALL, OutputModel, render_html
from jupyter_dist.views.run_display import NOTEBOOK

CR_COLLAPSE = re.compile(r".*\r(?=[^\n])")  # what ipyparallel does to the text it accumulates


def places(n: int, per_node: int = 2) -> list[RankPlace]:
    return [RankPlace(r, r // per_node, r % per_node, "127.0.0.1") for r in range(n)]


def test_settle_keeps_the_final_state_and_relabel_tag():
    assert settle("\r  0%|\r 50%|\r100%|") == "100%|"
    assert settle("windows line\r") == "windows line"
    assert settle("\x1e3\x1e\rA\rB") == "\x1e3\x1eB"
    assert settle("plain") == "plain"


def test_line_buffer_update_survives_ipyparallel_rewrites():
    buf, text, got = LineBuffer(), "", []
    for chunk in ["hello\n", "  0%|   |", "\r 50%|#  |", "\r100%|###|", "\n", "a\r", "b\n", "x\ry", "z\nlast"]:
        text += chunk
        if "\r" in chunk:
            text = CR_COLLAPSE.sub("", text)
        got += buf.update(text)
    got += buf.flush()
    whole = [line for line in got if not line.endswith("\r")]
    assert whole == ["hello", "100%|###|", "b", "yz", "last"]
    assert "  0%|   |\r" in got and " 50%|#  |\r" in got  # the bar's states, shown live


def test_line_buffer_feed():
    buf = LineBuffer()
    assert buf.feed("one\ntw") == ["one", "tw\r"]
    assert buf.feed("o\n") == ["two"]
    assert buf.feed("") == []
    assert buf.flush() == []


def test_rank_logs_keep_whole_lines_only(tmp_path):
    logs = RankLogs(tmp_path / "run", 2)
    logs.write(0, "stdout", ["a", "progress\r", "b"])
    logs.write(1, "stderr", ["oops", LINE_PREFIX + "{}"])  # a worker's metrics line is not output
    logs.close()
    assert (tmp_path / "run" / "rank-0.log").read_text() == "a\nb\n"
    assert (tmp_path / "run" / "rank-1.log").read_text() == "[stderr] oops\n"
    assert logs.counts[0] == 2


def test_text_sink_labels_filters_and_notes(tmp_path, capsys):
    logs = RankLogs(tmp_path / "run", 4)
    sink = TextSink()
    sink.start(places(4), (0,), logs)
    sink.lines(0, "stdout", ["hi", "bar\r"])
    sink.lines(1, "stdout", ["hidden"])
    sink.finish()
    out = capsys.readouterr().out
    assert "showing rank 0 of 4 (--ranks)" in out and str(logs.dir) in out
    assert "[rank 0|node 0] hi" in out
    assert "hidden" not in out and "bar" not in out


def metrics_batch(t0: float) -> dict:
    return {"key": "metrics", "data": {"t": [t0 + 1 + 0.1 * i for i in range(20)], "samples": [16] * 20}}


class RecordingDisplay:
    """A `RunDisplay` that records what the run asked it to show."""

    def __init__(self):
        self.shown = []

    def metrics(self, store):
        self.shown.append(("metrics", store))

    def scaling(self, result):
        self.shown.append(("scaling", result))

    def start_progress(self):
        return lambda up, n, elapsed: self.shown.append(("progress", up, n))


def test_text_sink_hands_its_metrics_to_the_display(tmp_path, capsys):
    shown = RecordingDisplay()
    sink = TextSink(run_display=shown)
    sink.start(places(2), None, RankLogs(tmp_path / "run", 2))
    sink.collected(0, metrics_batch(sink.metrics.t0))
    sink.finish()
    assert shown.shown == [("metrics", sink.metrics)]
    quiet = TextSink(charts=False, run_display=shown)  # --scaling charts the sizes together instead
    quiet.start(places(2), None, RankLogs(tmp_path / "run2", 2))
    quiet.collected(0, metrics_batch(quiet.metrics.t0))
    quiet.finish()
    assert len(shown.shown) == 1


def test_plain_display_prints_the_summary_and_the_last_start_line(tmp_path, capsys):
    sink = TextSink()  # no views handed in: the summary, no chart
    assert isinstance(sink.run_display, PlainDisplay)
    sink.start(places(1), None, RankLogs(tmp_path / "run", 1))
    sink.collected(0, metrics_batch(sink.metrics.t0))
    sink.finish()
    assert "rank 0: 160.0 samples/s" in capsys.readouterr().out
    progress = PlainDisplay().start_progress()
    for up in (1, 2, 2):
        progress(up, 2, 1.25)
    assert capsys.readouterr().out == "jupyter-dist: 2 engines started in 1.2 s\n"


def test_notebook_display_outside_a_kernel(capsys):
    progress = NOTEBOOK.start_progress()  # its live area is a no-op here
    progress(1, 2, 0.5)
    progress(2, 2, 1.0)
    assert capsys.readouterr().out == "jupyter-dist: 2 engines started in 1.0 s\n"
    sink = live_output.default_sink()  # not in a kernel: plain lines, the notebook's charts at the end
    assert type(sink) is TextSink and sink.run_display is NOTEBOOK


class FakeView:
    """Stands in for views.live.RunView: records what the sink pushes."""

    instances: list[FakeView] = []

    def __init__(self, ranks, placeholder=""):
        self.ranks, self.html, self.charts, self.closed = ranks, {}, [], False
        FakeView.instances.append(self)

    active = True

    def set_html(self, key, value):
        self.html[key] = value

    def set_status(self, text):
        self.status = text

    def set_chart(self, svg):
        self.charts.append(svg)

    def close(self):
        self.closed = True


@pytest.fixture
def live(monkeypatch, tmp_path):
    FakeView.instances = []
    monkeypatch.setattr(live_output, "RunView", FakeView)
    displayed: list[dict] = []
    monkeypatch.setattr(live_output, "publish_display_data", lambda data, metadata=None, **kw: displayed.append(data))
    monkeypatch.setattr(charts, "show_png", lambda png, caption: displayed.append({"image/png": png, "text/plain": caption}))
    logs = RankLogs(tmp_path / "run", 2)

    def make(**limits) -> LiveTextSink:
        sink = LiveTextSink()
        for k, v in limits.items():
            setattr(sink, k, v)
        sink.UPDATE_S = 0.01
        sink.start(places(2, per_node=1), None, logs)
        return sink

    return make, displayed, logs


def test_live_sink_tqdm_in_place_and_transcript_by_rank(live, capsys):
    make, displayed, logs = live
    sink = make()
    sink.lines(1, "stdout", ["one from 1"])
    sink.lines(0, "stderr", ["  0%|\r"])
    sink.lines(0, "stdout", ["zero"])
    sink.lines(0, "stderr", [" 50%|\r"])
    sink.lines(0, "stderr", ["100%|"])
    sink.display(1, {"data": {"image/png": "iVBOR", "text/plain": "<Figure>"}})
    sink.display(1, {"data": {"application/vnd.jupyter.widget-view+json": {"model_id": "x"}, "text/plain": "tqdm 3/10"}})
    sink.refresh()
    view = FakeView.instances[0]
    assert "100%|" in view.html[0] and "50%" not in view.html[0]  # replaced in place
    assert "<img src='data:image/png;base64,iVBOR'" in view.html[1]
    assert "[rank 0|node 0]" in view.html[ALL] and "[rank 1|node 1]" in view.html[ALL]
    sink.finish()
    assert view.closed
    out = capsys.readouterr().out
    lines = out.splitlines()
    # grouped by rank, rank 0 first; the bar once, in its final state, where it started
    assert lines[:3] == ["[rank 0|node 0] ! 100%|", "[rank 0|node 0] zero", "[rank 1|node 1] one from 1"]
    assert lines.count("[rank 1|node 1] display:") == 2
    assert displayed[0] == {"image/png": "iVBOR", "text/plain": "<Figure>"}
    assert displayed[1] == {"text/plain": "tqdm 3/10"}  # the widget view (it lives on the rank) is dropped


def test_live_sink_holds_back_past_the_limit(live, capsys):
    make, displayed, logs = live
    sink = make(KEEP_LINES_PER_RANK=5)
    sink.model = OutputModel(5, sink.labels)
    sink.lines(0, "stdout", [f"line {i}" for i in range(12)])
    sink.finish()
    out = capsys.readouterr().out
    assert f"[rank 0|node 0] ... 7 earlier line(s) held back; all are in {logs.paths[0]}" in out
    assert "line 6" not in out and "[rank 0|node 0] line 11" in out


def test_live_sink_metrics_draw_a_live_and_a_static_chart(live, capsys):
    make, displayed, logs = live
    sink = make()
    for rank in (0, 1):
        sink.collected(rank, {"key": "metrics", "data": {
            "t": [sink.metrics.t0 + 1 + 0.1 * i for i in range(20)], "samples": [16] * 20,
            "scalars": {"loss": [1.0 / (i + 1) for i in range(20)]}}})
    sink.refresh_chart()  # or the chart thread did: either way one chart, drawn from a copy
    deadline = time.monotonic() + 10
    while not FakeView.instances[0].charts and time.monotonic() < deadline:
        time.sleep(0.01)
    live_chart = FakeView.instances[0].charts[0]  # an SVG, drawn without matplotlib
    assert live_chart.startswith("<svg") and ">loss</text>" in live_chart and ">rank 1</text>" in live_chart
    sink.finish()
    chart = displayed[-1]
    assert chart["text/plain"] == "<jupyter-dist chart: samples/s by rank and their sum; loss by step; 2 rank(s)>"
    out = capsys.readouterr().out
    assert "rank 0: 160.0 samples/s" in out and "slowest: rank" in out


def test_render_html_escapes_and_limits():
    model = OutputModel(100)
    for i in range(10):
        model.line(0, "stdout", f"<b>{i}</b>")
    html = render_html(model.tails[0], 3, model, labelled=False)
    assert "&lt;b&gt;9&lt;/b&gt;" in html and "&lt;b&gt;6" not in html
    assert "7 earlier entries not shown live" in html


def test_clip_long_lines():
    assert ranks.clip("x" * (ranks.MAX_LINE + 10)).endswith("[10 more characters in the log]")


def test_charts_png_and_captions():
    store = MetricsStore(t0=0.0)
    assert charts.metrics_png(store) is None
    store.add(0, {"auto_t": [1.0 + 0.05 * i for i in range(40)]})
    png = charts.metrics_png(store, dpi=50)
    assert png[:4] == b"\x89PNG"
    assert charts.metrics_caption(store) == "<jupyter-dist chart: steps/s by rank; 1 rank(s)>"
    late = MetricsStore(t0=0.0)  # a launcher that took 25 s to start the training
    late.add(0, {"t": [25.0 + 0.01 * i for i in range(20)], "samples": [8] * 20})
    ax = charts.metrics_figure(late).axes[0]
    assert ax.get_xlabel() == "seconds since the first report()"
    lo, hi = ax.get_xlim()
    assert lo == 0.0 and hi < 0.25  # the training fills the axis
    res = scaling_result([(ScalingPoint(1, 1, 1, 0.0, 4.0), None), (ScalingPoint(2, 1, 2, 0.0, 2.5), None)])
    assert charts.png_bytes(charts.scaling_figure(res), dpi=50)[:4] == b"\x89PNG"


def test_live_sink_shows_its_view_on_output_or_once_the_run_outlives_a_short_cell(live, capsys):
    make, displayed, logs = live
    quiet = make()  # a warm `x = 1`: no output, done within SHOW_AFTER_S
    quiet.tick(0.05)
    quiet.finish()
    assert FakeView.instances == [] and quiet._loops == [] and capsys.readouterr().out == ""
    slow = make()  # a run that prints nothing for a while: the view once it outlives SHOW_AFTER_S
    slow.tick(slow.SHOW_AFTER_S / 2)
    assert FakeView.instances == []
    slow.tick(slow.SHOW_AFTER_S)
    slow.tick(slow.SHOW_AFTER_S * 2)
    assert len(FakeView.instances) == 1 and len(slow._loops) == 2
    slow.finish()
    assert FakeView.instances[0].closed and all(done.is_set() for done in slow._loops)
    printing = make()  # the first line shows it at once
    printing.lines(1, "stdout", ["hello"])
    printing.lines(0, "stdout", ["again"])
    assert len(FakeView.instances) == 2
    printing.finish()
    assert "[rank 1|node 1] hello" in capsys.readouterr().out
    failing = make()  # a quiet cell that fails at once: the view too, so a failed cell saves the same outputs
    failing.rank_failed(0)
    failing.rank_failed(1)
    assert len(FakeView.instances) == 3
    failing.finish()


def test_live_sink_redraws_the_tab_shown_and_the_hidden_ones_less_often(live, capsys):
    make, displayed, logs = live
    sink = make(HIDDEN_TABS_S=3600.0)
    sink.lines(0, "stdout", ["first"])
    view = FakeView.instances[0]
    view.selected_key = lambda: ALL  # the browser shows the all-ranks tab
    sink.refresh()
    assert "first" in view.html[0] and "first" in view.html[ALL]  # a run's first redraw draws every tab
    sink.lines(0, "stdout", ["second"])
    sink.refresh()
    assert "second" in view.html[ALL] and "second" not in view.html[0]
    sink._hidden_at = 0.0  # HIDDEN_TABS_S later
    sink.refresh()
    assert "second" in view.html[0]
    sink.finish()
