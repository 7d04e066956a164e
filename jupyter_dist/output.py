"""Where rank output goes: per-rank line assembly, log files, and the notebook sink.

Text arrives from the engines as growing strings per rank; `LineBuffer` cuts them into
whole lines so that two ranks never interleave mid-line. Every line of every rank is
written to that rank's log file whatever the view shows.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Protocol

from .layout import RankPlace


class LineBuffer:
    """Holds the unfinished tail of one stream; `feed` returns the finished lines."""

    def __init__(self) -> None:
        self._tail = ""

    def feed(self, text: str) -> list[str]:
        if not text:
            return []
        data = self._tail + text
        lines = data.split("\n")
        self._tail = lines.pop()
        return lines

    def flush(self) -> list[str]:
        tail, self._tail = self._tail, ""
        return [tail] if tail else []


class OutputSink(Protocol):
    """What the runner tells a view. Lines are whole; `rank` is the global rank."""

    def start(self, places: list[RankPlace], shown: tuple[int, ...] | None, logs: RankLogs) -> None: ...
    def lines(self, rank: int, stream: str, lines: list[str]) -> None: ...
    def display(self, rank: int, content: dict[str, Any]) -> None: ...
    def result(self, rank: int, content: dict[str, Any]) -> None: ...
    def collected(self, rank: int, item: dict[str, Any]) -> None: ...
    def finish(self) -> None: ...


def split_relabelled(rank: int, lines: list[str]) -> list[tuple[int, list[str]]]:
    """Group lines by the rank they belong to (see `engine.RELABEL`), keeping their order."""
    from .engine import RELABEL

    groups: list[tuple[int, list[str]]] = []
    for line in lines:
        owner = rank
        if line.startswith(RELABEL):
            tag, sep, rest = line[1:].partition(RELABEL)
            if sep and tag.isdigit():
                owner, line = int(tag), rest
        if groups and groups[-1][0] == owner:
            groups[-1][1].append(line)
        else:
            groups.append((owner, [line]))
    return groups


def rank_label(place: RankPlace, nodes: int) -> str:
    return f"[rank {place.rank}|node {place.node}]" if nodes > 1 else f"[rank {place.rank}]"


class TextSink:
    """Plain labelled lines in the cell's output: `[rank 1|node 0] text`. Readable saved or live."""

    def __init__(self) -> None:
        self.labels: dict[int, str] = {}
        self.shown: tuple[int, ...] | None = None

    def start(self, places: list[RankPlace], shown: tuple[int, ...] | None, logs: RankLogs) -> None:
        nodes = max((p.node for p in places), default=0) + 1
        self.labels = {p.rank: rank_label(p, nodes) for p in places}
        self.shown = shown

    def _visible(self, rank: int) -> bool:
        return self.shown is None or rank in self.shown

    def lines(self, rank: int, stream: str, lines: list[str]) -> None:
        if not self._visible(rank):
            return
        out = sys.stderr if stream == "stderr" else sys.stdout
        label = self.labels.get(rank, f"[rank {rank}]")
        out.write("".join(f"{label} {line}\n" for line in lines))
        out.flush()

    def display(self, rank: int, content: dict[str, Any]) -> None:
        if not self._visible(rank):
            return
        from IPython.display import publish_display_data

        print(f"{self.labels.get(rank, f'[rank {rank}]')} display:", flush=True)
        publish_display_data(content.get("data", {}), content.get("metadata", {}))

    def result(self, rank: int, content: dict[str, Any]) -> None:
        if not self._visible(rank):
            return
        text = content.get("data", {}).get("text/plain", "")
        label = self.labels.get(rank, f"[rank {rank}]")
        print(f"{label} Out: {text}", flush=True)

    def collected(self, rank: int, item: dict[str, Any]) -> None:
        """Data a rank sent (`engine.publish`: {"key", "data"}); plain text shows nothing of it."""

    def finish(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()


class RankLogs:
    """Per-rank log files of one run, readable by their owner only."""

    def __init__(self, root: Path, world_size: int) -> None:
        self.dir = root
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self.paths = {r: self.dir / f"rank-{r}.log" for r in range(world_size)}
        self._files = {}
        for r, path in self.paths.items():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            self._files[r] = os.fdopen(fd, "w", encoding="utf-8")
        self.counts = dict.fromkeys(self.paths, 0)

    def write(self, rank: int, stream: str, lines: list[str]) -> None:
        f = self._files[rank]
        prefix = "" if stream == "stdout" else "[stderr] "
        f.write("".join(f"{prefix}{line}\n" for line in lines))
        self.counts[rank] += len(lines)

    def close(self) -> None:
        for f in self._files.values():
            f.close()


class LiveTextSink(TextSink):
    """In a kernel: a live widget (arrival order) while the run goes; at the end the widget
    closes and the output is printed once, grouped by rank, so a saved notebook reads the
    same every time."""

    UPDATE_S = 0.25
    VIEW_LINES_PER_RANK = 2000

    def __init__(self) -> None:
        super().__init__()
        self.by_rank: dict[int, list[str]] = {}
        self.held: dict[int, int] = {}
        self.arrival: list[str] = []
        self.area: Any = None
        self.last = 0.0
        self.logs: RankLogs | None = None

    def start(self, places: list[RankPlace], shown: tuple[int, ...] | None, logs: RankLogs) -> None:
        from .views.live import LiveArea

        super().start(places, shown, logs)
        self.logs = logs
        self.by_rank = {p.rank: [] for p in places}
        self.held = dict.fromkeys(self.by_rank, 0)
        self.area = LiveArea("jupyter-dist: live output of the ranks")

    def lines(self, rank: int, stream: str, lines: list[str]) -> None:
        if not self._visible(rank):
            return
        label = self.labels.get(rank, f"[rank {rank}]")
        mark = " !" if stream == "stderr" else ""
        rendered = [f"{label}{mark} {line}" for line in lines]
        kept = self.by_rank.setdefault(rank, [])
        kept.extend(rendered)
        if len(kept) > self.VIEW_LINES_PER_RANK:
            drop = len(kept) - self.VIEW_LINES_PER_RANK
            del kept[:drop]
            self.held[rank] = self.held.get(rank, 0) + drop
        self.arrival.extend(rendered)
        if len(self.arrival) > self.VIEW_LINES_PER_RANK:
            del self.arrival[: len(self.arrival) - self.VIEW_LINES_PER_RANK]
        self._refresh()

    def transcript(self) -> str:
        parts = []
        for rank in sorted(self.by_rank):
            if self.held.get(rank):
                path = self.logs.paths[rank] if self.logs else "the rank's log file"
                parts.append(f"{self.labels.get(rank, rank)} ... {self.held[rank]} earlier lines held back; all are in {path}")
            parts.extend(self.by_rank[rank])
        return "\n".join(parts)

    def _refresh(self) -> None:
        import time

        now = time.monotonic()
        if self.area is None or now - self.last < self.UPDATE_S:
            return
        self.last = now
        self.area.set_text("\n".join(self.arrival))

    def finish(self) -> None:
        if self.area is not None:
            self.area.close()
        text = self.transcript()
        if text:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()


def default_sink() -> OutputSink:
    """The live display in a kernel, plain labelled lines elsewhere (terminal IPython, tests)."""
    from .views.live import in_kernel

    return LiveTextSink() if in_kernel() else TextSink()
