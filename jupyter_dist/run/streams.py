"""The ranks' stream output as the messages that carry it, appended as they arrive, never re-read.

ipyparallel's client keeps each engine's stdout and stderr as one growing string (and re-cuts it on
every carriage return); reading that string again on every poll made a burst's cost grow with what
was already printed. Instead a callback on each rank's message future (the hook `%%px --stream`
uses) puts every `stream` message's text on a queue as it arrives, on the client's I/O thread; the
runner takes the queued chunks from the notebook's main thread and hands only them on.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from typing import Any

DRAIN_SLICE_S = 0.02  # the most one drain works on a burst before it lets the kernel's other threads run
DRAIN_GAP_S = 0.002  # the pause between slices of a burst (the GIL free: the sidebar's subshell answers)
DRAIN_CHARS = 1 << 16  # what one rank's turn in a drain takes at most
# while a run's output is handed on, another thread of the kernel waiting for the GIL gets it after this
# (Python's default is 5 ms; a subshell's request needs it a dozen times): restored when the run ends
SWITCH_S = 0.0005
ATTACH_WAIT_S = 10.0  # how long the end of a run waits for the attach (the I/O thread is never that busy)


class RankStream:
    """One rank's stream chunks, `(stream name, text)`, in the order they arrived."""

    def __init__(self) -> None:
        self._chunks: deque[tuple[str, str]] = deque()

    def on_iopub(self, msg: dict[str, Any]) -> None:
        """Called on the client's I/O thread for every iopub message of this rank's request."""
        if msg["header"]["msg_type"] == "stream":
            content = msg["content"]
            self._chunks.append((content["name"], content["text"]))

    @property
    def pending(self) -> bool:
        """Chunks are queued (more arrived, or a `take` stopped at its limit)."""
        return bool(self._chunks)

    def take(self, limit: int | None = None) -> list[tuple[str, str]]:
        """The text queued since the last call (with `limit`, chunks up to about that many characters),
        consecutive chunks of one stream joined, in order (deque.popleft is safe against the appending
        thread)."""
        chunks = self._chunks
        out: list[tuple[str, list[str]]] = []
        size = 0
        while chunks and (limit is None or size < limit):
            stream, text = chunks.popleft()
            size += len(text)
            if out and out[-1][0] == stream:
                out[-1][1].append(text)
            else:
                out.append((stream, [text]))
        return [(stream, "".join(texts)) for stream, texts in out]


class RunStreams:
    """A `RankStream` on each of a request's message futures, attached on the client's I/O thread,
    where its iopub messages are dispatched: what arrived before is taken from the text the client
    accumulated so far, everything after from the callback, so no chunk is lost or doubled. Nothing
    here waits for that thread; `settled` does, before the last chunks are taken."""

    def __init__(self, client: Any, children: list[Any]) -> None:
        self.children = children
        self.ranks = [RankStream() for _ in children]
        self._attached = threading.Event()
        loop = getattr(client, "_io_loop", None)
        if loop is None:  # no I/O thread: nothing dispatches concurrently
            self._attach()
        else:
            loop.add_callback(self._attach)

    def _attach(self) -> None:
        try:
            for child, stream in zip(self.children, self.ranks, strict=True):
                md = child.output.metadata
                for name in ("stdout", "stderr"):
                    if md.get(name):
                        stream._chunks.append((name, md[name]))
                child.iopub_callbacks.append(stream.on_iopub)
        finally:
            self._attached.set()

    def settled(self, timeout: float = ATTACH_WAIT_S) -> bool:
        """True once attached (the caller then knows every chunk so far is queued)."""
        return self._attached.wait(timeout)

    def detach(self) -> None:
        """Remove the callbacks (ipyparallel may keep a finished request's futures)."""
        self.settled()
        for child, stream in zip(self.children, self.ranks, strict=True):
            with contextlib.suppress(ValueError):
                child.iopub_callbacks.remove(stream.on_iopub)
