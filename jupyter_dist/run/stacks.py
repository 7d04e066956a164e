"""Every rank's stack, for a person: ranks that share a stack grouped, the cell's frames first.

Pure: it reads what the ranks' agents answered (`engine/stacks.py`: per thread, frames outermost
first, each [file, line, function, source]) and returns text. `%dist stacks`, the sidebar's
Stacks button and a `--timeout` report all show it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_dist.engine.frameworks.torchrun_command import CELL_SCRIPT

CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(")
Frame = Sequence[Any]  # [file, line, function, source line]
# where code that is not the user's lives: frames there are folded into one line
LIBRARY_MARKERS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}", f"{os.sep}lib{os.sep}python",
                   f"{os.sep}jupyter_dist{os.sep}", "<frozen ")


@dataclass(frozen=True)
class RankGroup:
    """Ranks whose main threads stand in the same place, and that place's frames."""

    ranks: tuple[int, ...]
    frames: tuple[tuple[Any, ...], ...]

    @property
    def where(self) -> str:
        return where(self.frames)


def is_library(frame: Frame) -> bool:
    return any(marker in str(frame[0]) for marker in LIBRARY_MARKERS)


def main_frames(threads: Sequence[Mapping[str, Any]]) -> tuple[tuple[Any, ...], ...]:
    """The main thread's frames (the cell's thread) from one rank's answer."""
    for thread in threads:
        if thread.get("main"):
            return tuple(tuple(f) for f in thread.get("frames", ()))
    return ()


def by_rank(answers: Mapping[int, Any]) -> dict[int, list[Mapping[str, Any]]]:
    """Each rank's threads, its workers' in place of its engine's: an engine that waits on workers
    (--fresh's child, torchrun's workers) answers with their stacks marked {"worker", "rank"}
    (engine/stacks.py); rank None is the answering engine's own. A worker's stack wins over the
    engine of the same rank (torchrun: rank 1's engine is idle while node 0's engine runs its worker)."""
    own: dict[int, list[Mapping[str, Any]]] = {}
    from_workers: dict[int, list[Mapping[str, Any]]] = {}
    for rank, threads in answers.items():
        for thread in threads if isinstance(threads, list) else ():
            if "worker" in thread:
                r = thread.get("rank")
                from_workers.setdefault(rank if r is None else int(r), []).append(thread)
            else:
                own.setdefault(rank, []).append(thread)
        own.setdefault(rank, [])
    return {**own, **from_workers}


def group(answers: Mapping[int, Sequence[Mapping[str, Any]]]) -> list[RankGroup]:
    """Ranks grouped by their main thread's frames (file, line, function), largest group first."""
    by_place: dict[tuple[tuple[Any, ...], ...], list[int]] = {}
    frames_of: dict[tuple[tuple[Any, ...], ...], tuple[tuple[Any, ...], ...]] = {}
    for rank in sorted(answers):
        frames = main_frames(answers[rank])
        key = tuple((short_file(f[0]), f[1], f[2]) for f in frames)  # each engine names its cells' files
        by_place.setdefault(key, []).append(rank)
        frames_of.setdefault(key, frames)
    groups = [RankGroup(tuple(ranks), frames_of[key]) for key, ranks in by_place.items()]
    return sorted(groups, key=lambda g: (-len(g.ranks), g.ranks))


def where(frames: Sequence[Frame]) -> str:
    """"all_reduce at <cell>:41": the innermost call made from the user's code, and that line."""
    if not frames:
        return "no Python frames"
    own = [i for i, f in enumerate(frames) if not is_library(f)]
    if not own:
        f = frames[-1]
        return f"{f[2]} at {short_file(f[0])}:{f[1]}"
    i = own[-1]
    caller = frames[i]
    # a call into C (time.sleep, a lock's acquire) has no frame: its name is on the source line
    called = frames[i + 1][2] if i + 1 < len(frames) else called_on(str(caller[3])) or caller[2]
    return f"{called} at {short_file(caller[0])}:{caller[1]}"


def called_on(source: str) -> str | None:
    """The outermost call on a source line: `x = time.sleep(600)` -> `time.sleep`."""
    match = CALL.search(source)
    return match.group(1) if match else None


def short_file(path: str) -> str:
    """A cell's file as `<cell>`, others by their last two parts."""
    path = str(path)
    if (path.startswith("<ipython-input") or f"{os.sep}ipykernel_" in path or path == "<string>"
            or os.path.basename(path) == CELL_SCRIPT):
        return "<cell>"
    parts = path.split(os.sep)
    return os.sep.join(parts[-2:]) if len(parts) > 1 else path


def rank_words(ranks: Sequence[int]) -> str:
    """'rank 1', 'ranks 0,2,3', 'ranks 0-31' (a run of four or more consecutive ranks as a range)."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    parts: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts += [f"{start}-{prev}"] if prev - start >= 3 else [str(x) for x in range(start, prev + 1)]
        if r is not None:
            start = prev = r
    return "ranks " + ",".join(parts)


def headline(groups: Sequence[RankGroup]) -> str:
    """'ranks 0,2,3: all_reduce at <cell>:41; rank 1: sleep at <cell>:37'."""
    return "; ".join(f"{rank_words(g.ranks)}: {g.where}" for g in groups)


def render(groups: Sequence[RankGroup], missing: Mapping[int, str] | None = None) -> list[str]:
    """Lines: per group its ranks and frames, the user's frames in full, runs of library frames folded."""
    lines: list[str] = []
    for g in groups:
        lines.append(f"{rank_words(g.ranks)}: {g.where}")
        folded = 0
        for f in g.frames:
            if is_library(f):
                folded += 1
                continue
            if folded:
                lines.append(f"    ... {folded} library frame{'s' if folded > 1 else ''}")
                folded = 0
            lines.append(f"    {short_file(f[0])}:{f[1]} in {f[2]}" + (f": {f[3]}" if f[3] else ""))
        if folded:
            lines.append(f"    ... {folded} library frame{'s' if folded > 1 else ''}, innermost "
                         f"{g.frames[-1][2]} at {short_file(g.frames[-1][0])}:{g.frames[-1][1]}")
    for rank, why in sorted((missing or {}).items()):
        lines.append(f"rank {rank}: no stack ({why})")
    return lines
