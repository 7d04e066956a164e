"""The notebook's side of `jupyter_dist.report()`: the ranks' metrics, gathered by rank.

`MetricsStore` takes the batches each rank sends (`engine.metrics`: a display message, or a
stdout line under a launcher such as torchrun) and gives the chart's series (rates by rank and
time, their sum, scalars by step) and the run summary. `scaling_result` turns one run per world
size into `--scaling`'s table.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from jupyter_dist.common.channel import METRICS_LINE_PREFIX

UNITS = ("samples", "tokens", "steps")
# Below this span a rate is mostly timer and scheduling noise (2 steps of a tiny model take
# milliseconds): the summary says so instead of printing one.
MIN_MEASURED_S = 0.1


@dataclass
class RankSeries:
    """One rank's records, as columns. `scalars[name]` is aligned with `t` (None where absent)."""

    t: list[float] = field(default_factory=list)
    step: list[Any] = field(default_factory=list)
    samples: list[Any] = field(default_factory=list)
    tokens: list[Any] = field(default_factory=list)
    scalars: dict[str, list[Any]] = field(default_factory=dict)
    auto_t: list[float] = field(default_factory=list)

    def add(self, data: dict[str, Any]) -> None:
        t = list(data.get("t") or [])
        n0, n = len(self.t), len(t)
        self.t.extend(t)
        for name in ("step", "samples", "tokens"):
            col = data.get(name)
            getattr(self, name).extend(col if col is not None and len(col) == n else [None] * n)
        incoming = data.get("scalars") or {}
        for name in [n for n in incoming if n not in self.scalars]:  # in the order reported
            self.scalars[name] = [None] * n0
        for name, col in self.scalars.items():
            new = incoming.get(name)
            col.extend(new if new is not None and len(new) == n else [None] * n)
        self.auto_t.extend(data.get("auto_t") or [])


@dataclass
class RankRate:
    rank: int
    rate: float | None  # units per second
    units: float
    seconds: float


class MetricsStore:
    """Everything the ranks reported in one run, by rank."""

    def __init__(self, t0: float | None = None) -> None:
        self.t0 = time.time() if t0 is None else t0
        self.ranks: dict[int, RankSeries] = {}
        self.version = 0  # bumped on every batch: views redraw only when it moved

    def add(self, rank: int, data: dict[str, Any]) -> None:
        self.ranks.setdefault(rank, RankSeries()).add(data)
        self.version += 1

    def copy(self) -> MetricsStore:
        """A copy that later batches do not change (the live chart draws from one on its thread)."""
        other = MetricsStore(self.t0)
        other.version = self.version
        for rank, s in self.ranks.items():
            other.ranks[rank] = RankSeries(list(s.t), list(s.step), list(s.samples), list(s.tokens),
                                           {k: list(v) for k, v in s.scalars.items()}, list(s.auto_t))
        return other

    def add_line(self, rank: int, line: str) -> bool:
        """A metrics line from a worker's stdout (see METRICS_LINE_PREFIX); False if it is not one."""
        if not line.startswith(METRICS_LINE_PREFIX):
            return False
        with contextlib.suppress(ValueError, TypeError):  # a torn line is dropped, not raised
            self.add(rank, json.loads(line[len(METRICS_LINE_PREFIX):]))
        return True

    @property
    def empty(self) -> bool:
        return not any(s.t or s.auto_t for s in self.ranks.values())

    @property
    def source(self) -> str:
        """'report' when any rank called report(), else 'auto' (optimizer steps)."""
        return "report" if any(s.t for s in self.ranks.values()) else "auto"

    @property
    def unit(self) -> str:
        if self.source == "report":
            for name in ("samples", "tokens"):
                if any(v is not None for s in self.ranks.values() for v in getattr(s, name)):
                    return name
        return "steps"

    def scalar_names(self) -> list[str]:
        names: dict[str, None] = {}
        for s in self.ranks.values():
            names.update(dict.fromkeys(s.scalars))
        return list(names)

    def events(self, rank: int) -> tuple[list[float], list[float]]:
        """(times, amounts): each record and the units it stands for, in the run's unit."""
        s = self.ranks.get(rank)
        if s is None:
            return [], []
        if self.source == "auto":
            return list(s.auto_t), [1.0] * len(s.auto_t)
        unit = self.unit
        if unit != "steps":
            return list(s.t), [float(v or 0) for v in getattr(s, unit)]
        amounts, prev = [], None
        for v in s.step:
            if v is None or prev is None or v <= prev:
                amounts.append(1.0)
            else:
                amounts.append(float(v - prev))
            if v is not None:
                prev = v
        return list(s.t), amounts

    def mean_rates(self) -> dict[int, RankRate]:
        """Per rank: units after the first record over the time since it (the first marks the start)."""
        out = {}
        for rank in sorted(self.ranks):
            t, a = self.events(rank)
            if not t:
                continue
            if len(t) > 1 and t[-1] > t[0]:
                units, secs = sum(a[1:]), t[-1] - t[0]
            else:
                units, secs = sum(a), t[-1] - self.t0
            out[rank] = RankRate(rank, units / secs if secs > 0 else None, units, max(secs, 0.0))
        return out

    def total_rate(self) -> float | None:
        rates = [r.rate for r in self.mean_rates().values() if r.rate is not None]
        return sum(rates) if rates else None

    def rate_series(self, bins: int = 40) -> tuple[list[float], dict[int, list[float]], list[float]]:
        """Rates by rank in time bins: (bin centres in s since the first record, {rank: rates}, sum).

        The origin is the first record, not the run's start: a launcher's start-up (torchrun's
        takes tens of seconds) would otherwise squeeze the training into the chart's right edge.

        Each rank's cumulative units are interpolated linearly between its records, so a bin's
        rate does not alias with the reporting interval. NaN where a rank was active for less
        than a quarter of the bin.
        """
        import numpy as np

        ev = {r: self.events(r) for r in self.ranks}
        spans = [(t[0], t[-1]) for t, _ in ev.values() if len(t) > 1 and t[-1] > t[0]]
        if not spans:
            return [], {}, []
        lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
        width = nice_width((hi - lo) / bins)
        nb = max(1, math.ceil((hi - lo) / width))
        edges = lo + width * np.arange(nb + 1)
        by_rank: dict[int, list[float]] = {}
        for rank, (t, a) in sorted(ev.items()):
            if len(t) < 2 or t[-1] <= t[0]:
                continue
            tt = np.asarray(t, dtype=float)
            cum = np.concatenate([[0.0], np.cumsum(np.asarray(a[1:], dtype=float))])
            order = np.argsort(tt, kind="stable")
            tt, cum = tt[order], np.maximum.accumulate(cum[order])
            b0, b1 = np.maximum(edges[:-1], tt[0]), np.minimum(edges[1:], tt[-1])
            active = b1 - b0
            units = np.interp(b1, tt, cum) - np.interp(b0, tt, cum)
            with np.errstate(divide="ignore", invalid="ignore"):
                rates = np.where(active > 0.25 * width, units / np.where(active > 0, active, 1.0), np.nan)
            by_rank[rank] = [float(x) for x in rates]
        total = []
        for i in range(nb):
            vals = [r[i] for r in by_rank.values() if not math.isnan(r[i])]
            total.append(sum(vals) if vals else math.nan)
        origin = min(t[0] for t, _ in ev.values() if t)
        centres = [float(x) for x in (edges[:-1] + width / 2 - origin)]
        return centres, by_rank, total

    def scalar_series(self, name: str) -> dict[int, tuple[list[float], list[float]]]:
        """{rank: (x, y)}: x is the step where reported, else the record's index."""
        out = {}
        for rank in sorted(self.ranks):
            s = self.ranks[rank]
            col = s.scalars.get(name)
            if not col:
                continue
            xs, ys = [], []
            for i, v in enumerate(col):
                if v is not None and math.isfinite(v):
                    step = s.step[i] if i < len(s.step) else None
                    xs.append(float(step) if step is not None else float(i))
                    ys.append(float(v))
            if xs:
                out[rank] = (xs, ys)
        return out

    def summary(self) -> RunSummary:
        rates = self.mean_rates()
        known = {r: v for r, v in rates.items() if v.rate is not None}
        slowest = fastest = None
        if len(known) > 1:
            slowest = min(known.values(), key=lambda v: (v.rate, -v.rank))
            fastest = max(known.values(), key=lambda v: (v.rate, -v.rank))
        scalars = {}
        for name in self.scalar_names():
            series = self.scalar_series(name)
            firsts = [ys[0] for _, ys in series.values()]
            lasts = [ys[-1] for _, ys in series.values()]
            if firsts:
                scalars[name] = (sum(firsts) / len(firsts), sum(lasts) / len(lasts))
        seconds = max((v.seconds for v in rates.values()), default=0.0)
        return RunSummary(self.unit, self.source, rates, slowest, fastest, scalars, seconds)


@dataclass
class RunSummary:
    unit: str
    source: str
    rates: dict[int, RankRate]
    slowest: RankRate | None
    fastest: RankRate | None
    scalars: dict[str, tuple[float, float]]  # name -> (mean over ranks of the first, of the last value)
    seconds: float

    @property
    def total(self) -> float | None:
        vals = [v.rate for v in self.rates.values() if v.rate is not None]
        return sum(vals) if vals else None

    @property
    def behind_pct(self) -> float | None:
        if self.slowest is None or self.fastest is None or not self.fastest.rate:
            return None
        return 100.0 * (1.0 - (self.slowest.rate or 0.0) / self.fastest.rate)

    @property
    def too_short(self) -> bool:
        return self.seconds < MIN_MEASURED_S

    def lines(self) -> list[str]:
        u = f"{self.unit}/s"
        how = "from report()" if self.source == "report" else "counted from optimizer steps"
        head = f"jupyter-dist: run summary: {u} {how}, {len(self.rates)} rank(s), {self.seconds:.1f} s measured"
        if self.too_short:
            return [f"{head}: too short to measure a rate (under {MIN_MEASURED_S:g} s)", *self._scalar_lines()]
        out = [head]
        for r in self.rates.values():
            out.append(f"  rank {r.rank}: {fmt_rate(r.rate)} {u}")
        if self.total is not None and len(self.rates) > 1:
            out.append(f"  total: {fmt_rate(self.total)} {u}")
        if self.slowest is not None and self.fastest is not None:
            out.append(
                f"  slowest: rank {self.slowest.rank} at {fmt_rate(self.slowest.rate)} {u}, "
                f"{self.behind_pct:.1f}% behind the fastest (rank {self.fastest.rank})"
            )
        return out + self._scalar_lines()

    def _scalar_lines(self) -> list[str]:
        return [f"  {name} (mean over ranks): first {first:.4g}, last {last:.4g}" for name, (first, last) in self.scalars.items()]


def fmt_rate(rate: float | None) -> str:
    if rate is None:
        return "-"
    return f"{rate:,.1f}" if rate < 1e5 else f"{rate:,.0f}"


def nice_width(raw: float) -> float:
    """1, 2 or 5 times a power of ten, at least `raw`."""
    if raw <= 0:
        return 1e-3
    exp = math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        w = m * 10.0**exp
        if w >= raw:
            return w
    return 10.0 ** (exp + 1)


# -- scaling ------------------------------------------------------------------------------


@dataclass
class ScalingPoint:
    world_size: int
    nodes: int
    procs_per_node: int
    throughput: float  # units per second, summed over ranks
    elapsed: float


@dataclass
class ScalingResult:
    points: list[ScalingPoint]
    unit: str  # "samples/s", ... or "runs/s" (from the cell's wall time)

    @property
    def base(self) -> ScalingPoint:
        return self.points[0]

    def speedup(self, p: ScalingPoint) -> float:
        return p.throughput / self.base.throughput if self.base.throughput else math.nan

    def ideal(self, p: ScalingPoint) -> float:
        return p.world_size / self.base.world_size

    def efficiency(self, p: ScalingPoint) -> float:
        return self.speedup(p) / self.ideal(p)

    def lines(self) -> list[str]:
        how = "from wall time (call jupyter_dist.report() for samples/s)" if self.unit == "runs/s" else "summed over ranks"
        out = [f"jupyter-dist: scaling ({self.unit}, {how}):",
               "  world size  layout      throughput      speedup  ideal  efficiency"]
        for p in self.points:
            layout = f"{p.nodes}x{p.procs_per_node}"
            out.append(f"  {p.world_size:<10}  {layout:<10}  {fmt_rate(p.throughput):>14}  {self.speedup(p):7.2f}  "
                       f"{self.ideal(p):5.1f}  {100 * self.efficiency(p):9.0f}%")
        return out


def scaling_result(runs: list[tuple[ScalingPoint, MetricsStore | None]]) -> ScalingResult:
    """Throughput per size from the ranks' metrics when every run has them, else from wall time."""
    stores = [s for _, s in runs]
    if stores and all(s is not None and not s.empty and s.total_rate() for s in stores):
        unit = f"{stores[0].unit}/s"  # type: ignore[union-attr]
        points = [ScalingPoint(p.world_size, p.nodes, p.procs_per_node, s.total_rate() or 0.0, p.elapsed)  # type: ignore[union-attr]
                  for p, s in runs]
    else:
        unit = "runs/s"
        points = [ScalingPoint(p.world_size, p.nodes, p.procs_per_node, 1.0 / p.elapsed if p.elapsed > 0 else 0.0,
                               p.elapsed) for p, _ in runs]
    return ScalingResult(points, unit)


def scaling_shape(size: int, procs_per_node: int) -> tuple[int, int]:
    """(nodes, procs per node) for one world size: keep the procs per node where it divides."""
    if procs_per_node > 0 and size % procs_per_node == 0:
        return size // procs_per_node, procs_per_node
    return 1, size
