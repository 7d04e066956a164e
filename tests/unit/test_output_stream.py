"""The streaming output path's pure parts: chunks queued per rank, lines cut from appended text,
batches into the view's tails (issue #19)."""

from __future__ import annotations

import random

from jupyter_dist.run.output import LineBuffer
from jupyter_dist.run.streams import RankStream
from jupyter_dist.views.ranks import ALL, OutputModel


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
