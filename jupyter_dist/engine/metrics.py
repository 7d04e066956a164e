"""Metrics: `report()` on a rank, and their aggregation in the notebook.

Rank side. `report()` appends one tuple to a list; now and then (checked by the call itself)
the batch goes to the notebook through `engine.publish`, a display message that travels with
the rank's output: no round trip. What is left is sent at the end of every cell by an
`engine_cells.END_OF_CELL` hook. The gap between flushes starts at `FLUSH_FIRST_S` (the chart
shows up at once) and doubles to `FLUSH_MAX_S`: the engine's IOPub thread sends a display
message, and to do so takes the GIL from the training loop (about 3 more waits of a rank's main
thread per flush, benchmarks/README.md); the controller and the notebook handle every batch of
every rank, which adds up with many ranks. For torch, a global optimizer step hook counts steps
when the cell calls no `report()`. Outside jupyter-dist (say, an exported script under plain
torchrun) `report()` stays a cheap no-op.

Notebook side. `MetricsStore` gathers the batches by rank; it gives the chart's series (rates
by rank and time, their sum, scalars by step) and the run summary.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

FLUSH_FIRST_S = 0.5
FLUSH_MAX_S = 2.0
KEY = "metrics"
# Where no kernel carries display messages (a torchrun worker under jupyter-dist), a batch is
# one stdout line with this prefix; the notebook's sinks take it out of the rank's output.
LINE_PREFIX = "\x1fjupyter-dist-metrics "

_now = time.time  # wall clock: ranks and notebook share it (within NTP) for the time axis

# -- rank side -------------------------------------------------------------------------

_rows: list[tuple[Any, ...]] = []  # (t, step, samples, tokens, scalars)
_NO_SCALARS: dict[str, float] = {}  # shared, never written: a call with no scalars
_auto: list[float] = []  # times of optimizer steps, while the cell calls no report()
_next_flush = 0.0  # 0 until the cell's first record: that one only schedules the first flush
_flush_gap = FLUSH_FIRST_S  # until the next flush; doubles after each, to FLUSH_MAX_S
_reported = False  # report() was called in this cell
_state: dict[str, Any] = {"auto_opt": None, "torch_hook": None, "sender": None, "watching": False,
                          "atexit": False}


def report(step: int | None = None, samples: int | None = None, tokens: int | None = None,
           **scalars: float) -> None:
    """Record one point: `samples`/`tokens` done since the last call, and scalars (loss=...).

    Cheap (a tuple appended; see benchmarks/report_cost.py); the batch is sent 0.5 s after the
    cell's first record, 1 s later, then every 2 s, and at the end of the cell. Tensors are turned
    into floats here, which waits for the device: pass `float(loss)` where that matters.
    """
    global _reported
    t = _now()
    _reported = True
    if scalars:
        for k, v in scalars.items():
            if v.__class__ is not float:
                scalars[k] = _as_float(k, v)
        _rows.append((t, step, samples, tokens, scalars))
    else:
        _rows.append((t, step, samples, tokens, _NO_SCALARS))
    if t >= _next_flush:
        _due(t)


def _as_float(name: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"jupyter_dist.report({name}=...) needs a number, not {type(value).__name__}") from None


def _due(t: float) -> None:
    """The slow path: the cell's first record (set-up only), or a flush that is due."""
    global _next_flush, _flush_gap
    if _next_flush == 0.0:
        _watch()
        _flush_gap = FLUSH_FIRST_S
    else:
        flush()
        _flush_gap = min(_flush_gap * 2, FLUSH_MAX_S)
    _next_flush = t + _flush_gap


def _on_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """torch's global post-step hook: one step of the cell's first optimizer, unless report() is used."""
    if _reported:
        return
    oid = id(optimizer)
    first = _state["auto_opt"]
    if first is None:
        _state["auto_opt"] = oid
    elif first != oid:
        return
    t = _now()
    _auto.append(t)
    if t >= _next_flush:
        _due(t)


def take() -> dict[str, Any] | None:
    """The pending batch as a JSON-able payload (columns), or None; the buffers are emptied."""
    n, m = len(_rows), len(_auto)
    rows, auto = _rows[:n], _auto[:m]
    del _rows[:n], _auto[:m]
    if _reported:
        auto = []
    if not rows and not auto:
        return None
    payload: dict[str, Any] = {"v": 1}
    if rows:
        t, step, samples, tokens, scalars = zip(*rows, strict=True)
        k = -(-len(rows) // MAX_ROWS)  # records merged into one, past MAX_ROWS
        payload["t"] = _last(t, k)
        for name, col, merge in (("step", step, _last), ("samples", samples, _sum), ("tokens", tokens, _sum)):
            if col.count(None) < len(col):
                payload[name] = merge(col, k)
        names = _names(scalars)
        if names:
            payload["scalars"] = {n: _mean(list(map(dict.get, scalars, repeat(n))), k) for n in names}
    if auto:
        payload["auto_t"] = auto
    return payload


def _names(scalars: tuple[dict[str, float], ...]) -> list[str]:
    """Scalar names in the order first seen (C-speed for the usual: the same names every call)."""
    first = next((sc for sc in scalars if sc), None)
    if first is None:
        return []
    names = list(first)
    rest = set().union(*scalars).difference(names)
    return names + sorted(rest)


# A batch holds at most MAX_ROWS records: past that (thousands of calls a second) consecutive
# records are merged, units summed, scalars averaged, time and step those of the last, so
# rates stay exact and the flush costs the same whatever the call rate.
MAX_ROWS = 1000


def _chunks(col: tuple[Any, ...] | list[Any], k: int) -> list[Any]:
    return [col[i:i + k] for i in range(0, len(col), k)]


def _last(col: tuple[Any, ...], k: int) -> list[Any]:
    if k == 1:
        return list(col)
    out = []
    for chunk in _chunks(col, k):
        vals = [v for v in chunk if v is not None] if None in chunk else chunk
        out.append(vals[-1] if vals else None)
    return out


def _sum(col: tuple[Any, ...], k: int) -> list[Any]:
    if k == 1:
        return list(col)
    out = []
    for chunk in _chunks(col, k):
        if None in chunk:
            vals = [v for v in chunk if v is not None]
            out.append(sum(vals) if vals else None)
        else:
            out.append(sum(chunk))
    return out


def _mean(col: list[Any], k: int) -> list[Any]:
    if k == 1:
        return col
    out = []
    for chunk in _chunks(col, k):
        vals = [v for v in chunk if v is not None] if None in chunk else chunk
        out.append(math.fsum(vals) / len(vals) if vals else None)
    return out


def flush() -> None:
    """Send what is pending now (also what the end-of-cell hook does, via its return value)."""
    payload = take()
    if payload is not None:
        _sender()(payload)


def _sender() -> Any:
    sender = _state["sender"]
    if sender is None:
        sender = _state["sender"] = _pick_sender()
    return sender


def _pick_sender() -> Any:
    engine = sys.modules.get("jupyter_dist.engine.setup")
    if engine is not None and engine._state.get("rank") is not None:
        return lambda payload: engine.publish(KEY, payload)
    if os.environ.get("JUPYTER_DIST_FRAMEWORK"):  # a worker process of a jupyter-dist run
        if not _state["atexit"]:
            import atexit

            atexit.register(flush)
            _state["atexit"] = True
        return _print_line
    return lambda payload: None


def _print_line(payload: dict[str, Any]) -> None:
    sys.stdout.write(LINE_PREFIX + json.dumps(payload, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def end_of_cell() -> tuple[str, dict[str, Any]] | None:
    """`engine_cells.END_OF_CELL` hook: the cell's last batch, and a fresh start for the next cell."""
    global _next_flush, _reported
    payload = take()
    _next_flush, _reported = 0.0, False
    _state["auto_opt"] = None
    return (KEY, payload) if payload is not None else None


def _watch() -> None:
    """Hook the end of the cell on an engine (once); elsewhere flush at exit."""
    if _state["watching"]:
        return
    engine = sys.modules.get("jupyter_dist.engine.setup")
    if engine is not None and engine._state.get("rank") is not None:
        from jupyter_dist.engine.cells import END_OF_CELL, add_hook

        add_hook(END_OF_CELL, end_of_cell)
        _state["watching"] = True
    else:
        _sender()
        _state["watching"] = True


def install() -> None:
    """Engine set-up hook ("jupyter_dist.engine.metrics:install"): end-of-cell flush, torch step counting,
    and, before each cell, text progress bars (a widget bar made on a rank can never be seen)."""
    from jupyter_dist.engine.cells import BEFORE_CELL, add_hook

    _watch()
    _hook_torch()
    add_hook(BEFORE_CELL, _before_cell)


def _before_cell(cell: str) -> None:
    global _next_flush, _reported
    _next_flush, _reported = 0.0, False
    _state["auto_opt"] = None
    if _state["torch_hook"] is None and ("torch" in sys.modules or _imports(cell, "torch")):
        _hook_torch(load=True)
    if "tqdm" in cell:
        text_progress_bars()


def _imports(cell: str, module: str) -> bool:
    return f"import {module}" in cell or f"from {module}" in cell


def _hook_torch(load: bool = False) -> bool:
    """Register the global optimizer post-step hook once; import torch.optim only when `load`."""
    if _state["torch_hook"] is not None:
        return True
    if "torch" not in sys.modules and not load:
        return False
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
    except ImportError:
        return False
    _state["torch_hook"] = register_optimizer_step_post_hook(_on_optimizer_step)
    return True


def text_progress_bars() -> None:
    """On a rank, `tqdm.auto` would draw an ipywidgets bar whose updates go nowhere; use text."""
    import importlib.util

    if importlib.util.find_spec("tqdm") is None:
        return
    from tqdm import std

    for name in ("tqdm.auto", "tqdm.autonotebook"):
        try:
            mod = __import__(name, fromlist=["tqdm"])
        except Exception:  # noqa: BLE001 - a broken optional import is not ours to raise
            continue
        mod.tqdm, mod.trange = std.tqdm, std.trange


# -- notebook side ------------------------------------------------------------------------

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
        self.t0 = _now() if t0 is None else t0
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
        """A metrics line from a worker's stdout (see LINE_PREFIX); False if it is not one."""
        if not line.startswith(LINE_PREFIX):
            return False
        with contextlib.suppress(ValueError, TypeError):  # a torn line is dropped, not raised
            self.add(rank, json.loads(line[len(LINE_PREFIX):]))
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
