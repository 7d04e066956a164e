"""Where rank output goes: per-rank line assembly, log files, the sink protocol and the text sink.

The live widget sink is a view (views/live_output.py), handed to the session from outside.

Text arrives from the engines as stream messages per rank (run/streams.py); `LineBuffer` cuts it
into whole lines so that two ranks never interleave mid-line. A carriage return (a tqdm bar)
means "replace the current line": a whole line is handed on in its final state, and the
unfinished tail of a stream is handed on as a *provisional* line, ending in "\\r", that the
next line of the same stream replaces. Every whole line of every rank is written to that
rank's log file whatever the view shows.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any, Protocol

from IPython.display import publish_display_data

from jupyter_dist.common.channel import METRICS, METRICS_LINE_PREFIX, RELABEL
from jupyter_dist.plan.layout import RankPlace
from jupyter_dist.run.display import PlainDisplay, RunDisplay
from jupyter_dist.run.metrics_store import MetricsStore
from jupyter_dist.run.resources import ResourceStore

PROVISIONAL_MAX = 4000  # characters of an unfinished line shown live
WIDGET_MIMES = ("application/vnd.jupyter.widget-view+json", "application/vnd.jupyter.widget-state+json")


def settle(line: str) -> str:
    """The text a terminal would leave for a line with carriage returns: what follows the last one.

    A relabel tag (`channel.RELABEL`) in front is kept; a trailing "\\r" (CRLF) is dropped first.
    """
    if "\r" not in line:
        return line
    prefix = ""
    if line.startswith(RELABEL):
        tag, sep, rest = line[1:].partition(RELABEL)
        if sep and tag.isdigit():
            prefix, line = f"{RELABEL}{tag}{RELABEL}", rest
    line = line.rstrip("\r")
    return prefix + line[line.rfind("\r") + 1:]


def is_provisional(line: str) -> bool:
    return line.endswith("\r")


class LineBuffer:
    """One stream of one rank: finished lines, settled, and the unfinished tail as a provisional
    line when it changed (see the module's docstring).

    `update` takes the stream's whole text so far. ipyparallel collapses carriage returns in
    the text it accumulates, so the unfinished line (rarely the one just finished) is rewritten
    in place and the text does not only grow: it is re-read from the start of the current line
    rather than sliced at the old length. `feed` takes appended text, for sources that only grow
    (the runner's: each stream message once, run/streams.py); an unfinished line redrawn with "\r"
    is kept in its current state only, so a progress bar costs the same at its thousandth redraw.
    """

    MARK = 64  # characters before the current line's start, to find it again after a rewrite

    def __init__(self) -> None:
        self._tail = ""
        self._start = 0
        self._mark = ""
        self._shown: str | None = None  # the tail last handed on as provisional

    def update(self, text: str) -> list[str]:
        start = self._start
        if start and (start > len(text) or text[start - len(self._mark):start] != self._mark):
            start = self._resync(text, start)
        end = text.rfind("\n", start)
        out: list[str] = []
        if end >= 0:
            out = [settle(line) for line in text[start:end].split("\n")]
            start = end + 1
            self._mark = text[max(0, start - self.MARK):start]
            self._shown = None
        self._start = start
        return out + self._provisional(text[start:])

    def _resync(self, text: str, start: int) -> int:
        found = text.rfind(self._mark, 0, start)
        if found >= 0:
            return found + len(self._mark)
        return text.rfind("\n", 0, min(start, len(text))) + 1

    def feed(self, text: str) -> list[str]:
        if not text:
            return []
        text = self._tail + text
        lines = text.split("\n")
        tail = lines.pop()
        out = [settle(line) for line in lines] if "\r" in text else lines  # a scan, not a call per line
        if lines:
            self._shown = None
        if "\r" in tail:  # a bar redrawn without a newline: keep its state only, not every redraw
            tail = settle(tail) + ("\r" if tail.endswith("\r") else "")
        return out + self._provisional(tail)

    def _provisional(self, tail: str) -> list[str]:
        self._tail = tail
        if not tail or tail == self._shown:
            return []
        self._shown = tail
        return [settle(tail)[-PROVISIONAL_MAX:] + "\r"]

    def flush(self) -> list[str]:
        tail, self._tail, self._shown = self._tail, "", None
        return [settle(tail)] if tail else []


class OutputSink(Protocol):
    """What the runner tells a view. `rank` is the global rank.

    Lines are whole, except a provisional line (ending in "\\r"): the current state of an
    unfinished line, replaced by the next line of the same rank and stream.
    """

    def start(self, places: list[RankPlace], shown: tuple[int, ...] | None, logs: RankLogs) -> None: ...
    def lines(self, rank: int, stream: str, lines: list[str]) -> None: ...
    def display(self, rank: int, content: dict[str, Any]) -> None: ...
    def result(self, rank: int, content: dict[str, Any]) -> None: ...
    def collected(self, rank: int, item: dict[str, Any]) -> None: ...
    def tick(self, elapsed: float) -> None: ...  # the run still goes, `elapsed` seconds after it was sent
    def rank_failed(self, rank: int) -> None: ...  # the rank's cell raised or its engine died
    def finish(self) -> None: ...


def starts_a_line(text: str, prefix: str) -> bool:
    """Whether a line of `text` starts with `prefix`: one scan (a burst's lines cost no call each)."""
    return ("\n" + text).find("\n" + prefix) >= 0


def any_starts(lines: list[str], prefix: str) -> bool:
    return starts_a_line("\n".join(lines), prefix)


def split_relabelled(rank: int, lines: list[str]) -> list[tuple[int, list[str]]]:
    """Group lines by the rank they belong to (see `channel.RELABEL`), keeping their order."""
    if not any_starts(lines, RELABEL):
        return [(rank, lines)]
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


def shown_data(content: dict[str, Any]) -> dict[str, Any]:
    """A rank's display bundle as the notebook can show it: widget views live on the rank, so
    they go, and their text/plain stays."""
    data = {k: v for k, v in (content.get("data") or {}).items() if k not in WIDGET_MIMES}
    if not data:
        data = {"text/plain": "(a widget on the rank: it cannot be shown in the notebook)"}
    return data


def filter_note(shown: tuple[int, ...] | None, world: int, logs: RankLogs | None) -> str | None:
    """The one line that says whose output is hidden and where it is kept."""
    if shown is None:
        return None
    visible = [r for r in shown if r < world]
    if len(visible) == world:
        return None
    who = ", ".join(str(r) for r in visible) or "no rank"
    where = logs.dir if logs is not None else "the ranks' log files"
    return f"jupyter-dist: showing rank {who} of {world} (--ranks); every rank's output is in {where}/rank-N.log"


class TextSink:
    """Plain labelled lines in the cell's output: `[rank 1|node 0] text`. Readable saved or live.

    Metrics the ranks send are gathered; at the end `run_display` shows their chart and summary
    (`charts=False` leaves that to the caller, as `--scaling` does).
    """

    def __init__(self, charts: bool = True, run_display: RunDisplay | None = None) -> None:
        self.labels: dict[int, str] = {}
        self.shown: tuple[int, ...] | None = None
        self.logs: RankLogs | None = None
        self.metrics = MetricsStore()
        self.resources = ResourceStore()  # filled by the session's ResourcePoller while the run goes
        self.charts = charts
        self.run_display: RunDisplay = run_display or PlainDisplay()
        self.world = 0

    def start(self, places: list[RankPlace], shown: tuple[int, ...] | None, logs: RankLogs) -> None:
        nodes = max((p.node for p in places), default=0) + 1
        self.labels = {p.rank: rank_label(p, nodes) for p in places}
        self.shown = shown
        self.logs = logs
        self.world = len(logs.counts) if logs is not None else len(places)
        self.metrics = MetricsStore()
        note = filter_note(shown, self.world, logs)
        if note:
            print(note, flush=True)

    def _visible(self, rank: int) -> bool:
        return self.shown is None or rank in self.shown

    def label(self, rank: int) -> str:
        return self.labels.get(rank, f"[rank {rank}]")

    def _text_lines(self, rank: int, lines: list[str]) -> list[str]:
        """The lines to show: metrics lines taken out, provisional ones dropped (text has no 'replace')."""
        return [line for line in lines if not is_provisional(line) and not self.metrics.add_line(rank, line)]

    def lines(self, rank: int, stream: str, lines: list[str]) -> None:
        lines = self._text_lines(rank, lines)
        if not lines or not self._visible(rank):
            return
        out = sys.stderr if stream == "stderr" else sys.stdout
        label = self.label(rank)
        out.write("".join(f"{label} {line}\n" for line in lines))
        out.flush()

    def display(self, rank: int, content: dict[str, Any]) -> None:
        if not self._visible(rank):
            return
        print(f"{self.label(rank)} display:", flush=True)
        publish_display_data(shown_data(content), content.get("metadata", {}))

    def result(self, rank: int, content: dict[str, Any]) -> None:
        if not self._visible(rank):
            return
        text = content.get("data", {}).get("text/plain", "")
        print(f"{self.label(rank)} Out: {text}", flush=True)

    def collected(self, rank: int, item: dict[str, Any]) -> None:
        """Data a rank sent (`engine.publish`: {"key", "data"}); metrics are kept for the chart."""
        if item.get("key") == METRICS and isinstance(item.get("data"), dict):
            self.metrics.add(rank, item["data"])

    def tick(self, elapsed: float) -> None:
        """Called from the notebook's main thread between polls while the run goes; nothing to do here."""

    def rank_failed(self, rank: int) -> None:
        """Called from the notebook's main thread when a rank's failure is seen; the error comes after."""

    def finish(self) -> None:
        # every write here flushes itself; a flush before the charts keeps them after the text. Not
        # otherwise: in a kernel each flush waits for its I/O thread, twice (a quiet cell's 1-4 ms)
        charts = self.charts and not self.metrics.empty
        resources = self.charts and not self.resources.empty
        if charts or resources:
            sys.stdout.flush()
            sys.stderr.flush()
        if charts:
            self.run_display.metrics(self.metrics)
        if resources:
            self.run_display.resources(self.resources)


class RankLogs:
    """Per-rank log files of one run, readable by their owner only. Whole lines only, settled.

    The folder and a rank's file are made by its first line: a run whose ranks print nothing
    writes nothing (and costs no file-system call)."""

    def __init__(self, root: Path, world_size: int) -> None:
        self.dir = root
        self._files: dict[int, Any] = {}
        self.counts = dict.fromkeys(range(world_size), 0)

    @functools.cached_property
    def paths(self) -> dict[int, Path]:
        """Each rank's file (made on first use: a warm cell that prints nothing builds no paths)."""
        return {r: self.dir / f"rank-{r}.log" for r in self.counts}

    def _file(self, rank: int) -> Any:
        f = self._files.get(rank)
        if f is None:
            if not self._files:
                self.dir.mkdir(parents=True, exist_ok=True)
                os.chmod(self.dir, 0o700)
            fd = os.open(self.paths[rank], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            f = self._files[rank] = os.fdopen(fd, "w", encoding="utf-8")
        return f

    def write(self, rank: int, stream: str, lines: list[str]) -> None:
        kept = lines[:-1] if lines and is_provisional(lines[-1]) else lines  # a burst's unfinished last line
        text = "\n".join(kept) + "\n"  # lines hold no newline; one scan each finds a provisional or metrics line
        if "\r\n" in text or starts_a_line(text, METRICS_LINE_PREFIX):
            kept = [line for line in kept if not is_provisional(line) and not line.startswith(METRICS_LINE_PREFIX)]
            text = "\n".join(kept) + "\n"
        if not kept:
            return
        if stream != "stdout":
            text = "[stderr] " + text[:-1].replace("\n", "\n[stderr] ") + "\n"
        self._file(rank).write(text)
        self.counts[rank] += len(kept)

    def close(self) -> None:
        for f in self._files.values():
            f.close()



def emit(rank: int, stream: str, lines: list[str], sink: OutputSink, logs: RankLogs) -> None:
    """A rank's new whole lines into its log file and the sink (lines a torchrun leader relabelled go to
    their own rank's)."""
    for owner, group in split_relabelled(rank, lines):
        if owner not in logs.counts:
            owner = rank
        logs.write(owner, stream, group)
        sink.lines(owner, stream, group)
