"""The streaming output path's pure parts: chunks queued per rank, lines cut from appended text,
batches into the view's tails (issue #19)."""

from __future__ import annotations

import gc
import html
import random

from jupyter_dist.common.channel import METRICS_LINE_PREFIX, RELABEL
from jupyter_dist.run.output import LineBuffer, RankLogs, split_relabelled
from jupyter_dist.run.streams import RankStream
from jupyter_dist.views import ranks
from jupyter_dist.views.live_output import freeze_old_objects
from jupyter_dist.views.ranks import ALL, OutputModel, render_html


def stream_msg(name: str, text: str) -> dict:
    return {"header": {"msg_type": "stream"}, "content": {"name": name, "text": text}}


def test_chunks_are_taken_once_in_order_with_one_stream_joined():
    s = RankStream()
    for msg in (stream_msg("stdout", "a\n"), stream_msg("stdout", "b"), stream_msg("stderr", "oops\n"),
                {"header": {"msg_type": "display_data"}, "content": {}}, stream_msg("stdout", "\n")):
        s.on_iopub(msg)
    assert s.take() == [("stdout", "a\nb"), ("stderr", "oops\n"), ("stdout", "\n")]
    assert s.take() == []


def test_a_bar_redrawn_without_a_newline_keeps_its_state_only():
    buf = LineBuffer()
    assert buf.feed("\r 0%") == [" 0%\r"]
    for i in range(1, 1000):
        buf.feed(f"\r{i / 10:.1f}%")
    assert len(buf._tail) < 20  # not every redraw
    assert buf.feed("\r100%\n") == ["100%"]
    assert buf.feed("a\r") == ["a\r"]
    assert buf.feed("\n") == ["a"]  # CRLF: the line as printed
    assert buf.feed("ab\r") == ["ab\r"]
    assert buf.feed("c") == ["c\r"]  # after a carriage return, the line starts again
    assert buf.flush() == ["c"]


def test_batches_into_the_tails_equal_line_by_line():
    rng = random.Random(19)
    for limit in (3, 10, 50):
        one, many = OutputModel(limit), OutputModel(limit)
        for step in range(300):
            rank, stream = rng.randrange(3), rng.choice(("stdout", "stderr"))
            if rng.random() < 0.05:
                content = {"data": {"text/plain": str(step)}}
                one.display(rank, content)
                many.display(rank, content)
                continue
            batch = [f"{step}.{i}" for i in range(rng.choice((0, 1, 2, 5, limit, 3 * limit)))]
            if rng.random() < 0.3:
                batch.append(f"{step} bar\r")
            for line in batch:
                one.line(rank, stream, line)
            many.lines(rank, stream, batch)
            for key in one.tails:
                a, b = one.tails[key], many.tails[key]
                assert [row[:3] for row in a.rows()] == [row[:3] for row in b.rows()], (limit, step, key)
                assert (a.held_lines, a.held_displays) == (b.held_lines, b.held_displays)
                assert {k: e.text for k, e in a.pending.items()} == {k: e.text for k, e in b.pending.items()}
    assert ALL in many.tails


def reference_html(tail, last: int, model: OutputModel, labelled: bool) -> str:
    """The live tab's HTML drawn row by row (as before batches): what `render_html` must still draw."""
    entries = list(tail.rows())[-last:]
    hidden = tail.size - len(entries) + tail.held_lines + tail.held_displays
    drawn = {i for i in [i for i, e in enumerate(entries) if e[1] == "display"][-ranks.LIVE_DISPLAYS:]}
    out = [f"<div style='opacity:.6'>... {hidden} earlier entries not shown live "
           "(the saved output and the log files have them)</div>"] if hidden else []
    block: list[str] = []

    def close() -> None:
        if block:
            out.append("<pre style='margin:0;white-space:pre-wrap'>" + "\n".join(block) + "</pre>")
            block.clear()

    for i, (rank, stream, text, content) in enumerate(entries):
        label = html.escape(model.label(rank)) + " " if labelled else ""
        if stream == "display":
            if i in drawn:
                close()
                out.append(f"<div>{label}</div>{ranks.display_html(content or {})}")
            else:
                block.append(f"{label}[display: {html.escape(', '.join((content or {}).get('data', {})))}]")
            continue
        text = html.escape(ranks.clip(text))
        if stream == "stderr":
            text = f"<span style='color:#b22'>{text}</span>"
        block.append(f"{label}{text}")
    close()
    return "<div style='max-height:28em;overflow:auto;font-family:monospace;font-size:12px'>" + "".join(out) + "</div>"


def test_batches_draw_as_rows_would():
    rng = random.Random(4)
    model = OutputModel(40)
    for step in range(200):
        rank, stream = rng.randrange(3), rng.choice(("stdout", "stderr"))
        if rng.random() < 0.05:
            model.display(rank, {"data": {"text/plain": f"<{step}>", "text/html": f"<i>{step}</i>"}})
            continue
        batch = [rng.choice((f"{step}.{i} <&>", "x" * (ranks.MAX_LINE + 3))) for i in range(rng.choice((1, 3, 30, 90)))]
        if rng.random() < 0.3:
            batch.append(f"{step} bar\r")
        model.lines(rank, stream, batch)
        for key in (rank, ALL):
            for last in (5, 200):
                tail = model.tails[key]
                assert render_html(tail, last, model, key == ALL) == reference_html(tail, last, model, key == ALL)
    assert sum(1 for t in model.tails[ALL].items if isinstance(t, tuple)) < 40  # batches, not a tuple a line


def test_logs_write_a_batch_as_its_lines(tmp_path):
    logs = RankLogs(tmp_path, 2)
    logs.write(0, "stdout", ["a", "b", "unfinished\r"])
    logs.write(0, "stderr", ["e1", "", "e2"])
    logs.write(1, "stdout", ["x", METRICS_LINE_PREFIX + "{}", "bar\r", "y"])
    logs.write(1, "stdout", ["partial\r"])
    logs.close()
    assert (tmp_path / "rank-0.log").read_text() == "a\nb\n[stderr] e1\n[stderr] \n[stderr] e2\n"
    assert (tmp_path / "rank-1.log").read_text() == "x\ny\n"
    assert logs.counts == {0: 5, 1: 2}


def test_relabelled_lines_split_with_or_without_a_tag():
    assert split_relabelled(3, ["a", "b"]) == [(3, ["a", "b"])]
    tagged = f"{RELABEL}5{RELABEL}"
    assert split_relabelled(3, ["a", tagged + "b", tagged + "c", "d"]) == [(3, ["a"]), (5, ["b", "c"]), (3, ["d"])]
    assert split_relabelled(3, [f"a{RELABEL}"]) == [(3, [f"a{RELABEL}"])]


def test_a_run_freezes_the_kernels_objects_once_and_unfreezes_them():
    assert gc.get_freeze_count() == 0
    try:
        assert freeze_old_objects() and gc.get_freeze_count() > 0
        assert not freeze_old_objects()  # frozen by someone else: left to them
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
