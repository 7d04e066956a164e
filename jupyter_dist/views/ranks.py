"""The per-rank output model behind the live view and the saved transcript.

Each rank keeps the tail of its output (lines and rich displays, in order); a provisional
line (a tqdm bar's current state) is replaced in place by the next line of its stream. One
more tail, `ALL`, holds every shown rank's output in arrival order for the "all ranks" view.
"""

from __future__ import annotations

import base64
import html
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

ALL = -1  # the key of the all-ranks tail
MAX_LINE = 4000  # characters of one line shown; the log has all of it
LIVE_DISPLAYS = 3  # rich displays drawn in a live tab (older ones as a one-line mark)


@dataclass
class Entry:
    """A display, or a provisional line (its text replaced in place): the rare entries. Whole lines
    are kept in batches (`Batch`), not one object each."""

    rank: int
    stream: str  # "stdout", "stderr" or "display"
    text: str = ""
    content: dict[str, Any] | None = None


# (rank, stream, lines): whole lines of one rank's stream, in order. A plain tuple of strings: the
# garbage collector stops tracking it at its first collection, so a burst leaves nothing per line to
# traverse (an object per line made the kernel's full collections long, holding the GIL)
Batch = tuple[int, str, tuple[str, ...]]
Row = tuple[int, str, str, "dict[str, Any] | None"]  # one entry, as drawn: rank, stream, text, content


def size_of(item: Batch | Entry) -> int:
    return 1 if isinstance(item, Entry) else len(item[2])


class Tail:
    """The last `limit` entries of one view (lines and displays), and how many were held back."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: deque[Batch | Entry] = deque()
        self.size = 0  # entries in `items`: a batch counts its lines
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
        if provisional:
            entry = self.pending[key] = Entry(rank, stream, text)
            self.items.append(entry)
        else:
            self.items.append((rank, stream, (text,)))
        self.size += 1
        self._trim()

    def add(self, batch: Batch, skipped: int, provisional: Entry | None) -> None:
        """A batch of one stream's whole lines, then its provisional line if any, as `line` one by one
        would leave them, but the lines that would enter and leave again within the batch only counted
        (`skipped`): a burst costs the tail's size, not its own. The batch and the provisional entry are
        shared with the other tail: only a pending entry is ever changed, and it is pending in each."""
        self.held_lines += skipped
        if batch[2]:
            self.items.append(batch)
            self.size += len(batch[2])
        if provisional is not None:
            self.items.append(provisional)
            self.size += 1
            self.pending[(provisional.rank, provisional.stream)] = provisional
        self._trim()

    def display(self, rank: int, content: dict[str, Any]) -> None:
        self.items.append(Entry(rank, "display", content=content))
        self.size += 1
        self._trim()

    def _trim(self) -> None:
        items = self.items
        while self.size > self.limit:
            old = items[0]
            if isinstance(old, Entry):
                items.popleft()
                self.size -= 1
                if old.stream == "display":
                    self.held_displays += 1
                    continue
                self.held_lines += 1
                for key, entry in list(self.pending.items()):
                    if entry is old:
                        del self.pending[key]
                continue
            rank, stream, lines = old
            cut = min(len(lines), self.size - self.limit)
            if cut == len(lines):
                items.popleft()
            else:
                items[0] = (rank, stream, lines[cut:])
            self.size -= cut
            self.held_lines += cut

    def last(self, n: int) -> Tail:
        """A copy of the last `n` entries, the others counted as held back: what a live tab draws,
        taken under the view's lock and drawn outside it."""
        copy = Tail(n)
        for item in reversed(self.items):
            if copy.size >= n:
                break
            copy.items.appendleft(item)
            copy.size += size_of(item)
        copy._trim()
        copy.held_lines = self.held_lines + self.size - copy.size
        copy.held_displays = self.held_displays
        return copy

    def rows(self) -> Iterator[Row]:
        """Every entry in order, one row each (for the saved transcript and tests; drawing goes by batch)."""
        for item in self.items:
            if isinstance(item, Entry):
                yield item.rank, item.stream, item.text, item.content
            else:
                rank, stream, lines = item
                for text in lines:
                    yield rank, stream, text, None

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
        """A batch of one rank's stream, as `line` for each (only the last may be provisional). Per batch,
        not per line: one tuple of the lines kept, shared by the rank's tail and the all-ranks tail."""
        if not lines:
            return
        if len(lines) > 1 and "\r\n" in "\n".join(lines[:-1]) + "\n":  # not as the runner hands them on
            for line in lines:
                self.line(rank, stream, line)
            return
        provisional = lines[-1].endswith("\r")
        tails = (self.rank(rank), self.tails[ALL])
        first = lines[0][:-1] if provisional and len(lines) == 1 else lines[0]
        for tail in tails:  # the first line may complete each tail's provisional one
            tail.line(rank, stream, first, provisional and len(lines) == 1)
        if len(lines) > 1:
            skipped = max(0, len(lines) - 1 - self.limit)
            kept = lines[1 + skipped:]
            entry = Entry(rank, stream, kept.pop()[:-1]) if provisional else None
            batch = (rank, stream, tuple(kept))
            for tail in tails:
                tail.add(batch, skipped, entry)
        self._dirty.update((rank, ALL))

    def display(self, rank: int, content: dict[str, Any]) -> None:
        self.rank(rank).display(rank, content)
        self.tails[ALL].display(rank, content)
        self._dirty.update((rank, ALL))

    def take_dirty(self) -> list[int]:
        dirty, self._dirty = sorted(self._dirty), set()
        return dirty

    def mark_dirty(self, keys: list[int]) -> None:
        """Changed tails left for a later refresh (taken but not drawn)."""
        self._dirty.update(keys)

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
        for _, stream, text, content in tail.rows():
            if stream == "display":
                parts.append((label, content or {}))
            else:
                mark = " !" if stream == "stderr" else ""
                parts.append(f"{label}{mark} {clip(text)}")
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
    """The last `last` entries of a tail as one HTML block (lines in <pre>, displays drawn). A batch of
    lines is escaped and labelled as one string, not line by line."""
    shown = tail.last(last)
    hidden = tail.size - shown.size + tail.held_lines + tail.held_displays
    items = list(shown.items)
    displays_left = LIVE_DISPLAYS
    drawn: set[int] = set()
    for i in range(len(items) - 1, -1, -1):
        item = items[i]
        if isinstance(item, Entry) and item.stream == "display" and displays_left:
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

    for i, item in enumerate(items):
        if isinstance(item, Entry):
            rank, stream, lines = item.rank, item.stream, (item.text,)
        else:
            rank, stream, lines = item
        label = html.escape(model.label(rank)) + " " if labelled else ""
        if stream == "display":
            assert isinstance(item, Entry)
            if i in drawn:
                close_block()
                out.append(f"<div>{label}</div>{display_html(item.content or {})}")
            else:
                block.append(f"{label}[display: {html.escape(', '.join((item.content or {}).get('data', {})))}]")
            continue
        if max(map(len, lines)) > MAX_LINE:
            lines = tuple(map(clip, lines))
        text = html.escape("\n".join(lines))  # lines hold no newline: one per line after the join
        if stream == "stderr":
            text = "<span style='color:#b22'>" + text.replace("\n", "</span>\n<span style='color:#b22'>") + "</span>"
        if label:
            text = label + text.replace("\n", "\n" + label)
        block.append(text)
    close_block()
    return "<div style='max-height:28em;overflow:auto;font-family:monospace;font-size:12px'>" + "".join(out) + "</div>"
