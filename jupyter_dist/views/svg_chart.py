"""The live chart as an inline SVG string: the panels of `charts.metrics_figure`, drawn as text.

Why not matplotlib for the live chart: one Agg redraw costs ~0.1 s of CPU, and while a run goes
that CPU comes out of the ranks' (on a small machine they use every core). Writing the same axes,
ticks and lines as SVG elements costs about a millisecond, and the browser rasterises it. Every
series is cut down to `MAX_POINTS` (the minimum and maximum of each stretch kept, so spikes
stay), so the cost is bounded however long the run. The static chart at the end of a run stays
matplotlib's PNG (`charts.show_metrics`), so a saved notebook is unchanged.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jupyter_dist.run.metrics_store import MetricsStore
from jupyter_dist.views.charts import MAX_LEGEND_RANKS, MAX_SCALARS

# matplotlib's tab10, so the live chart and the saved one colour a rank alike
TAB10 = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
MAX_POINTS = 300  # per series
MARGIN = 0.05  # of the data's span on each free side, as matplotlib's autoscale
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 44, 10, 22, 34  # plot area inside a panel, in px
NOTE = "not enough points yet"


@dataclass
class Series:
    xs: Sequence[float]  # a list, or a float array once downsampled
    ys: Sequence[float]
    colour: str
    label: str | None = None
    width: float = 1.0
    opacity: float = 0.8


@dataclass
class Panel:
    title: str
    xlabel: str
    series: list[Series] = field(default_factory=list)
    x_from_zero: bool = False
    y_from_zero: bool = False
    legend: str | None = None  # "lower right", "best" or None
    note: str | None = None  # a message in the middle of the axes


@dataclass
class Box:
    """The plot area of a panel in px, and the data limits it maps."""

    left: float
    top: float
    width: float
    height: float
    x0: float
    x1: float
    y0: float
    y1: float

    # a value or an array of them (`pixels`)
    def x(self, v: Any) -> Any:
        return self.left + (v - self.x0) * self.width / (self.x1 - self.x0)

    def y(self, v: Any) -> Any:
        return self.top + self.height - (v - self.y0) * self.height / (self.y1 - self.y0)


def metrics_svg(store: MetricsStore, width: int = 340, height: int = 220) -> str | None:
    """The chart of `store` as a self-contained `<svg>`; `width` x `height` px per panel, two
    panels a row. None when there is nothing to draw (as `charts.metrics_figure`)."""
    return panels_svg(metrics_panels(store), width, height)


def panels_svg(panels: list[Panel], width: int, height: int) -> str | None:
    """`panels` as one self-contained `<svg>`, two a row, `width` x `height` px each; None for none."""
    if not panels:
        return None
    ncols = min(len(panels), 2)
    nrows = math.ceil(len(panels) / ncols)
    w, h = ncols * width, nrows * height
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
           f'style="display:block;max-width:100%;height:auto" font-family="sans-serif">',
           f'<rect width="{w}" height="{h}" fill="white"/>']
    for i, panel in enumerate(panels):
        out += panel_svg(panel, (i % ncols) * width, (i // ncols) * height, width, height)
    out.append("</svg>")
    return "\n".join(out)


def metrics_panels(store: MetricsStore) -> list[Panel]:
    """What `charts.metrics_figure` plots: the rates panel, then up to MAX_SCALARS scalar panels."""
    centres, by_rank, total = store.rate_series()
    scalars = first_scalars(store)
    if not centres and not scalars:
        return []
    colours = {rank: TAB10[i % len(TAB10)] for i, rank in enumerate(sorted(store.ranks))}
    labelled = len(by_rank) <= MAX_LEGEND_RANKS
    return [rates_panel(store, centres, by_rank, total, colours, labelled)] + [
        scalar_panel(name, series, colours, labelled) for name, series in scalars.items()]


def first_scalars(store: MetricsStore) -> dict[str, dict[int, tuple[list[float], list[float]]]]:
    """The first MAX_SCALARS scalars that have a point, each series built once."""
    out = {}
    for name in store.scalar_names():
        series = store.scalar_series(name)
        if series:
            out[name] = series
            if len(out) == MAX_SCALARS:
                break
    return out


def rates_panel(store: MetricsStore, centres: list[float], by_rank: dict[int, list[float]],
                total: list[float], colours: dict[int, str], labelled: bool) -> Panel:
    title = f"{store.unit}/s" + (" (optimizer steps)" if store.source == "auto" else "")
    what = "report()" if store.source == "report" else "optimizer step"
    panel = Panel(title, f"seconds since the first {what}", x_from_zero=True, y_from_zero=True)
    if not centres:
        panel.note = NOTE
        return panel
    for rank, rates in by_rank.items():
        panel.series.append(Series(centres, rates, colours.get(rank, TAB10[0]),
                                   f"rank {rank}" if labelled else None))
    if len(by_rank) > 1:
        panel.series.append(Series(centres, total, "#000000", "sum", width=2.0, opacity=1.0))
    if by_rank:
        panel.legend = "lower right"
    return panel


def scalar_panel(name: str, series: dict[int, tuple[list[float], list[float]]],
                 colours: dict[int, str], labelled: bool) -> Panel:
    panel = Panel(name, "step", legend="best" if labelled else None)
    for rank, (xs, ys) in series.items():
        panel.series.append(Series(xs, ys, colours.get(rank, TAB10[0]), f"rank {rank}" if labelled else None))
    return panel


# -- drawing ------------------------------------------------------------------------------------


def panel_svg(panel: Panel, left: float, top: float, width: float, height: float) -> list[str]:
    """One panel's elements: title, grid and ticks, the series, legend, axis label, frame."""
    series = [Series(*downsample(s.xs, s.ys), s.colour, s.label, s.width, s.opacity) for s in panel.series]
    x0, x1 = limits([s.xs for s in series], panel.x_from_zero)
    y0, y1 = limits([s.ys for s in series], panel.y_from_zero)
    box = Box(left + PAD_LEFT, top + PAD_TOP, width - PAD_LEFT - PAD_RIGHT, height - PAD_TOP - PAD_BOTTOM,
              x0, x1, y0, y1)
    out = ['<g class="panel">', text(left + width / 2 + (PAD_LEFT - PAD_RIGHT) / 2, top + 15, panel.title, 12, "middle")]
    out += axes_svg(box)
    drawn = [pixels(s, box) for s in series]
    for s, (px, py) in zip(series, drawn, strict=True):
        out += polylines(s, px, py)
    if panel.note:
        out.append(text(box.left + box.width / 2, box.top + box.height / 2 + 4, panel.note, 11, "middle"))
    labelled = [s for s in series if s.label]
    if panel.legend and labelled:
        out += legend_svg(labelled, box, panel.legend, drawn)
    out.append(text(box.left + box.width / 2, top + height - 4, panel.xlabel, 10, "middle"))
    out += [f'<rect x="{box.left:.1f}" y="{box.top:.1f}" width="{box.width:.1f}" height="{box.height:.1f}" '
            f'fill="none" stroke="#333" stroke-width="0.8"/>', "</g>"]
    return out


def axes_svg(box: Box) -> list[str]:
    """Light grid lines and labels at the nice ticks of both axes."""
    out = ['<g stroke="#b0b0b0" stroke-opacity="0.5" stroke-width="0.8">']
    xs, ys = nice_ticks(box.x0, box.x1), nice_ticks(box.y0, box.y1)
    bottom, right = box.top + box.height, box.left + box.width
    out += [f'<line x1="{box.x(v):.1f}" y1="{box.top:.1f}" x2="{box.x(v):.1f}" y2="{bottom:.1f}"/>' for v in xs]
    out += [f'<line x1="{box.left:.1f}" y1="{box.y(v):.1f}" x2="{right:.1f}" y2="{box.y(v):.1f}"/>' for v in ys]
    out.append('</g><g font-size="9" fill="#333">')
    out += [text(box.x(v), bottom + 11, label, None, "middle") for v, label in zip(xs, tick_labels(xs), strict=True)]
    out += [text(box.left - 3, box.y(v) + 3, label, None, "end") for v, label in zip(ys, tick_labels(ys), strict=True)]
    out.append("</g>")
    return out


def pixels(s: Series, box: Box) -> tuple[Any, Any]:
    """The series' points in px, as arrays (NaN where a value is missing)."""
    return box.x(np.asarray(s.xs, dtype=float)), box.y(np.asarray(s.ys, dtype=float))


def polylines(s: Series, px: Any, py: Any) -> list[str]:
    """The series as polylines, broken where a value is missing (NaN), as matplotlib draws it."""
    ok = np.isfinite(px) & np.isfinite(py)
    # runs of finite points: where `ok` switches on, and off
    edges = np.flatnonzero(np.diff(np.concatenate([[False], ok, [False]]).astype(np.int8)))
    style = f'fill="none" stroke="{s.colour}" stroke-width="{s.width:g}" stroke-opacity="{s.opacity:g}"'
    out = []
    for a, b in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
        xy = np.column_stack([px[a:b], py[a:b]]).ravel().tolist()
        points = ("%.1f,%.1f " * (b - a) % tuple(xy)).rstrip()
        out.append(f'<polyline {style} stroke-linejoin="round" points="{points}"/>')
    return out


def legend_svg(entries: list[Series], box: Box, where: str, drawn: list[tuple[Any, Any]]) -> list[str]:
    """A framed legend in a corner of the plot area: "best" picks the corner with fewest points."""
    w = 30 + 5.5 * max(len(s.label or "") for s in entries)
    h = 6 + 12 * len(entries)
    corners = {"upper right": (box.left + box.width - w - 4, box.top + 4),
               "upper left": (box.left + 4, box.top + 4),
               "lower left": (box.left + 4, box.top + box.height - h - 4),
               "lower right": (box.left + box.width - w - 4, box.top + box.height - h - 4)}
    if where == "best":
        where = min(corners, key=lambda c: points_inside(drawn, *corners[c], w, h))
    x, y = corners.get(where, corners["upper right"])
    out = [f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h}" fill="white" fill-opacity="0.8" '
           f'stroke="#ccc" rx="2"/>']
    for i, s in enumerate(entries):
        ly = y + 9 + 12 * i
        out.append(f'<line x1="{x + 5:.1f}" y1="{ly:.1f}" x2="{x + 21:.1f}" y2="{ly:.1f}" stroke="{s.colour}" '
                   f'stroke-width="{s.width:g}" stroke-opacity="{s.opacity:g}"/>')
        out.append(text(x + 25, ly + 3, s.label or "", 9, None))
    return out


def points_inside(drawn: list[tuple[Any, Any]], x: float, y: float, w: float, h: float) -> int:
    """How many drawn points (px) a legend at (x, y, w, h) would cover."""
    return sum(int(((px >= x) & (px <= x + w) & (py >= y) & (py <= y + h)).sum()) for px, py in drawn)


def text(x: float, y: float, content: str, size: float | None, anchor: str | None) -> str:
    attrs = f' font-size="{size:g}"' if size else ""
    attrs += f' text-anchor="{anchor}"' if anchor else ""
    return f'<text x="{x:.1f}" y="{y:.1f}"{attrs}>{html.escape(content)}</text>'


# -- numbers ------------------------------------------------------------------------------------


def downsample(xs: Sequence[float], ys: Sequence[float], limit: int = MAX_POINTS) -> tuple[Any, Any]:
    """At most `limit` points, as float arrays: in each of limit/2 equal stretches, the lowest and
    the highest point, in order (first and last kept), so the line's envelope and spikes survive."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    n = len(x)
    if n <= limit:
        return x, y
    k = math.ceil(n / max(1, (limit - 2) // 2))  # points per stretch
    rows = math.ceil(n / k)
    finite = np.isfinite(y)
    lows, highs = np.full(rows * k, np.inf), np.full(rows * k, -np.inf)
    lows[:n] = np.where(finite, y, np.inf)
    highs[:n] = np.where(finite, y, -np.inf)
    base = np.arange(rows) * k
    keep = np.concatenate([base + lows.reshape(rows, k).argmin(axis=1),
                           base + highs.reshape(rows, k).argmax(axis=1), [0, n - 1]])
    keep = np.unique(np.minimum(keep, n - 1))
    return x[keep], y[keep]


def limits(columns: list[Any], from_zero: bool) -> tuple[float, float]:
    """Axis limits around the finite values with a margin; from 0 when `from_zero`; 0..1 if empty."""
    values = np.concatenate(columns) if columns else np.empty(0)
    values = values[np.isfinite(values)]
    if not values.size:
        return 0.0, 1.0
    lo, hi = float(values.min()), float(values.max())
    if from_zero:
        lo = min(lo, 0.0)
    if hi == lo:
        pad = abs(lo) * 0.1 or 1.0
        return (lo if from_zero else lo - pad), hi + pad
    span = hi - lo
    return (lo if from_zero and lo == 0.0 else lo - MARGIN * span), hi + MARGIN * span


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """About `target` ticks inside [lo, hi] at multiples of 1, 2, 2.5 or 5 times a power of ten."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    lo, hi = min(lo, hi), max(lo, hi)
    if hi == lo:
        return [lo]
    exp = math.floor(math.log10(hi - lo))
    steps = [m * 10.0 ** e for e in range(exp + 1, exp - 3, -1) for m in (5, 2.5, 2, 1)]

    def span(step: float) -> tuple[int, int]:
        return math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)

    def miss(step: float) -> int:
        first, last = span(step)
        return abs(last - first + 1 - target)

    best = min(steps, key=miss)  # the first of a tie: the larger step
    first, last = span(best)
    return [round(i * best, 12) + 0.0 for i in range(first, last + 1)]


def tick_labels(ticks: list[float]) -> list[str]:
    """Labels with as many decimals as the step needs; past 10 000 in k, M or G."""
    if not ticks:
        return []
    step = ticks[1] - ticks[0] if len(ticks) > 1 else abs(ticks[0]) or 1.0
    top = max(abs(v) for v in ticks)
    scale, suffix = 1.0, ""
    if top >= 1e4:
        power = min(3, int(math.log10(top) // 3))
        scale, suffix = 1000.0**power, "kMG"[power - 1]
    step /= scale
    decimals = 0
    while decimals < 12 and abs(step * 10**decimals - round(step * 10**decimals)) > 1e-6 * step * 10**decimals:
        decimals += 1
    return [f"{v / scale + 0.0:.{decimals}f}{suffix}" if v or not suffix else "0" for v in ticks]  # + 0.0: no "-0"
