"""engine/setup.py: the rank's flush that waits for its send never raises out of ipykernel's
`execute_request` (a raise there loses the cell's reply, and the notebook waits for that rank forever)."""

from __future__ import annotations

import io
import threading
from types import SimpleNamespace

from jupyter_dist.engine.setup import _flush_until_sent, has_unsent


def closed_buffer() -> io.StringIO:
    buffer = io.StringIO("sent")
    buffer.close()
    return buffer


def written(text: str) -> io.StringIO:
    buffer = io.StringIO()
    buffer.write(text)
    return buffer


def test_unsent_text_is_seen_in_any_parents_buffer() -> None:
    assert not has_unsent({})
    assert not has_unsent({"a": io.StringIO()})
    assert has_unsent({"a": io.StringIO(), "b": written("line\n")})


def test_a_buffer_the_io_thread_closed_counts_as_text_being_sent() -> None:
    assert has_unsent({"a": io.StringIO(), "b": closed_buffer()})


def test_without_buffers_to_look_at_it_assumes_text() -> None:
    assert has_unsent(None)


def test_flush_with_a_closed_buffer_flushes_and_waits_for_the_io_thread() -> None:
    flushed: list[bool] = []
    scheduled: list[object] = []
    alive = threading.Event()  # a stand-in I/O thread that runs what is scheduled on it
    worker = threading.Thread(target=alive.wait)
    worker.start()

    def schedule(fn: object) -> None:
        scheduled.append(fn)
        fn()  # type: ignore[operator]

    stream = SimpleNamespace(_buffers={"parent": closed_buffer()}, flush=lambda: flushed.append(True),
                             pub_thread=SimpleNamespace(thread=worker, schedule=schedule))
    try:
        _flush_until_sent(stream)
        stream.flush()  # raised ValueError before: I/O operation on closed file
    finally:
        alive.set()
        worker.join()
    assert flushed == [True]
    assert len(scheduled) == 1
