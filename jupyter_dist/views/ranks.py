"""The per-rank output model behind the live view and the saved transcript.

Each rank keeps the tail of its output (lines and rich displays, in order); a provisional
line (a tqdm bar's current state) is replaced in place by the next line of its stream. One
more tail, `ALL`, holds every shown rank's output in arrival order for the "all ranks" view.
"""

from __future__ import annotations

import base64
import html
import itertools
from collections import deque
from dataclasses import dataclass
from typing import Any

ALL = -1  # the key of the all-ranks tail
MAX_LINE = 4000  # characters of one line shown; the log has all of it
LIVE_DISPLAYS = 3  # rich displays drawn in a live tab (older ones as a one-line mark)


@dataclass
class Entry:
    rank: int
    stream: str  # "stdout", "stderr" or "display"
    text: str = ""
    content: dict[str, Any] | None = None


def new_entries(rank: int, stream: str, texts: list[str], limit: int) -> tuple[int, list[Entry]]:
    """The entries of the last `limit` texts, and how many before them are only counted."""
    skipped = max(0, len(texts) - limit)
    return skipped, [Entry(rank, stream, text) for text in texts[skipped:]]


class Tail:
    """The last `limit` entries of one view, and how many were held back."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.entries: deque[Entry] = deque()
        self.held_lines = 0
        self.held_displays = 0
        self.pending: dict[tuple[int, str], Entry] = {}  # provisional entries by (rank, stream)

    def line(self, rank: int, stream: str, text: str, provisional: bool) -> None:
        key = (rank, stream)
        entry = self.pending.get(key)
        if entry is not None:
            entry.text = text
            if not provisional:
                del self.pending[key]
            return
        entry = Entry(rank, stream, text)
        self.entries.append(entry)
        if provisional:
            self.pending[key] = entry
        self._trim()

    def add(self, entries: list[Entry], skipped: int, last_provisional: bool) -> None:
        """A batch of one stream's lines, as `line` one by one would leave them (only the last may be
        provisional), but the lines that would enter and leave again within the batch only counted
        (`skipped`): a burst costs the tail's size, not its own. The entries (`new_entries`) are shared
        with the other tail: only a pending one is ever changed, and it is pending in each tail holding it."""
        self.held_lines += skipped
        self.entries.extend(entries)
        if last_provisional and entries:
            self.pending[(entries[-1].rank, entries[-1].stream)] = entries[-1]
        self._trim()

    def display(self, rank: int, content: dict[str, Any]) -> None:
        self.entries.append(Entry(rank, "display", content=content))
        self._trim()

    def _trim(self) -> None:
        entries = self.entries
        while len(entries) > self.limit:
            old = entries.popleft()
            if old.stream == "display":
                self.held_displays += 1
            else:
                self.held_lines += 1
            if self.pending:
                for key, entry in list(self.pending.items()):
                    if entry is old:
                        del self.pending[key]

    def last(self, n: int) -> Tail:
        """A copy of the last `n` entries, the others counted as held back: what a live tab draws,
        taken under the view's lock and drawn outside it."""
        copy = Tail(n)
        size = len(self.entries)
        copy.entries = deque(itertools.islice(self.entries, max(0, size - n), size))
        copy.held_lines = self.held_lines + size - len(copy.entries)
        copy.held_displays = self.held_displays
        return copy

    def settle(self) -> None:
        """The run is over: a provisional line left is the final state of its line."""
        self.pending.clear()


class OutputModel:
    """Tails by rank plus the all-ranks tail; remembers which changed since the last refresh."""

    def __init__(self, limit: int, labels: dict[int, str] | None = None) -> None:
        self.limit = limit
        self.labels = labels or {}
        self.tails: dict[int, Tail] = {ALL: Tail(limit)}
        self._dirty: set[int] = set()

    def rank(self, rank: int) -> Tail:
        tail = self.tails.get(rank)
        if tail is None:
            tail = self.tails[rank] = Tail(self.limit)
        return tail

    def label(self, rank: int) -> str:
        return self.labels.get(rank, f"[rank {rank}]")

    def line(self, rank: int, stream: str, line: str) -> None:
        provisional = line.endswith("\r")
        text = line[:-1] if provisional else line
        self.rank(rank).line(rank, stream, text, provisional)
        self.tails[ALL].line(rank, stream, text, provisional)
        self._dirty.update((rank, ALL))

    def lines(self, rank: int, stream: str, lines: list[str]) -> None:
        """A batch of one rank's stream, as `line` for each (only the last may be provisional)."""
        if not lines:
            return
        if any(line.endswith("\r") for line in lines[:-1]):  # not as the runner hands them on
            for line in lines:
                self.line(rank, stream, line)
            return
        provisional = lines[-1].endswith("\r")
        texts = [*lines[:-1], lines[-1][:-1]] if provisional else lines
        tails = (self.rank(rank), self.tails[ALL])
        for tail in tails:  # the first line may complete each tail's provisional one
            tail.line(rank, stream, texts[0], provisional and len(texts) == 1)
        # one entry per line for both tails: a burst makes half the objects (the kernel's GC runs less)
        skipped, entries = new_entries(rank, stream, texts[1:], self.limit)
        for tail in tails:
            tail.add(entries, skipped, provisional)
        self._dirty.update((rank, ALL))

    def display(self, rank: int, content: dict[str, Any]) -> None:
        self.rank(rank).display(rank, content)
        self.tails[ALL].display(rank, content)
        self._dirty.update((rank, ALL))

    def take_dirty(self) -> list[int]:
        dirty, self._dirty = sorted(self._dirty), set()
        return dirty

    def settle(self) -> None:
        for tail in self.tails.values():
            tail.settle()

    def ranks(self) -> list[int]:
        return sorted(r for r in self.tails if r != ALL)


def clip(text: str) -> str:
    if len(text) <= MAX_LINE:
        return text
    return f"{text[:MAX_LINE]} ... [{len(text) - MAX_LINE} more characters in the log]"


def held_note(tail: Tail, where: str) -> str | None:
    if not tail.held_lines and not tail.held_displays:
        return None
    what = f"{tail.held_lines} earlier line(s)"
    if tail.held_displays:
        what += f" and {tail.held_displays} display(s)"
    return f"... {what} held back; all are in {where}"


def transcript_parts(model: OutputModel, logs: Any = None) -> list[str | tuple[str, dict[str, Any]]]:
    """The saved output, grouped by rank: text lines, and (label, content) for each display."""
    parts: list[str | tuple[str, dict[str, Any]]] = []
    for rank in model.ranks():
        tail = model.tails[rank]
        label = model.label(rank)
        path = str(logs.paths[rank]) if logs is not None and rank in getattr(logs, "paths", {}) else "the rank's log file"
        note = held_note(tail, path)
        if note:
            parts.append(f"{label} {note}")
        for e in tail.entries:
            if e.stream == "display":
                parts.append((label, e.content or {}))
            else:
                mark = " !" if e.stream == "stderr" else ""
                parts.append(f"{label}{mark} {clip(e.text)}")
    return parts


def display_html(content: dict[str, Any]) -> str:
    """A rank's display as HTML for the live view: an image, its HTML, or its text."""
    data = content.get("data") or {}
    for mime in ("image/png", "image/jpeg"):
        if mime in data:
            return f"<img src='data:{mime};base64,{data[mime]}' style='max-width:100%'>"
    if "image/svg+xml" in data:
        svg = base64.b64encode(str(data["image/svg+xml"]).encode()).decode()
        return f"<img src='data:image/svg+xml;base64,{svg}' style='max-width:100%'>"
    if "text/html" in data:
        return f"<div>{data['text/html']}</div>"
    return f"<pre style='margin:0'>{html.escape(str(data.get('text/plain', '')))}</pre>"


def render_html(tail: Tail, last: int, model: OutputModel, labelled: bool) -> str:
    """The last `last` entries of a tail as one HTML block (lines in <pre>, displays drawn)."""
    entries = list(tail.entries)[-last:]
    hidden = len(tail.entries) - len(entries) + tail.held_lines + tail.held_displays
    displays_left = LIVE_DISPLAYS
    drawn: set[int] = set()
    for i in range(len(entries) - 1, -1, -1):
        if entries[i].stream == "display" and displays_left:
            drawn.add(i)
            displays_left -= 1
    out: list[str] = []
    if hidden:
        out.append(f"<div style='opacity:.6'>... {hidden} earlier entries not shown live "
                   "(the saved output and the log files have them)</div>")
    block: list[str] = []

    def close_block() -> None:
        if block:
            out.append("<pre style='margin:0;white-space:pre-wrap'>" + "\n".join(block) + "</pre>")
            block.clear()

    for i, e in enumerate(entries):
        label = html.escape(model.label(e.rank)) + " " if labelled else ""
        if e.stream == "display":
            if i in drawn:
                close_block()
                out.append(f"<div>{label}</div>{display_html(e.content or {})}")
            else:
                block.append(f"{label}[display: {html.escape(', '.join((e.content or {}).get('data', {})))}]")
            continue
        text = html.escape(clip(e.text))
        if e.stream == "stderr":
            text = f"<span style='color:#b22'>{text}</span>"
        block.append(f"{label}{text}")
    close_block()
    return "<div style='max-height:28em;overflow:auto;font-family:monospace;font-size:12px'>" + "".join(out) + "</div>"
