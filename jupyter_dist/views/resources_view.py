"""Every rank's CPU, memory and GPU drawn: live beside the throughput chart, and kept at the end.

Live, the panels are svg_chart's (inline SVG, a millisecond a redraw). At the end of a run that
lasted a few samples, the same panels are one PNG (matplotlib, as the throughput chart), each
rank's peaks in its legend: an `image/png` output alone, which nbval does not compare, so the saved
tutorials stay comparable while every run's resources are kept in the notebook. A rank that came
near its memory limit is named in a line of text.
"""

from __future__ import annotations

import base64
import math
from typing import Any

from IPython.display import display

from jupyter_dist.run.resources import GIB, ResourceStore
from jupyter_dist.views.charts import MAX_LEGEND_RANKS, _figure, png_bytes
from jupyter_dist.views.svg_chart import TAB10, Panel, Series, panels_svg


def thinned(samples: list[dict[str, Any]], max_points: int | None) -> list[dict[str, Any]]:
    """At most about `max_points` of `samples`, evenly spaced, the last one always kept."""
    if max_points is None or len(samples) <= max_points:
        return samples
    step = -(-len(samples) // max_points)
    kept = samples[::step]
    return kept if kept[-1] is samples[-1] else [*kept, samples[-1]]


def resource_panels(samples: dict[int, list[dict[str, Any]]], max_points: int | None = None) -> list[Panel]:
    """CPU % and resident memory (GiB) by rank over the run's seconds; GPU use and memory where sampled.
    `max_points`: each rank's series thinned to about that many points (the live view's)."""
    samples = {r: thinned(s, max_points) for r, s in samples.items()}
    ranks = sorted(r for r, s in samples.items() if s)
    if not ranks:
        return []
    t0 = min(samples[r][0]["t"] for r in ranks)
    labelled = len(ranks) <= MAX_LEGEND_RANKS
    colours = {rank: TAB10[i % len(TAB10)] for i, rank in enumerate(ranks)}
    xlabel = "seconds since the run's first sample"
    cpu = Panel("CPU % (100 = one core)", xlabel, x_from_zero=True, y_from_zero=True,
                legend="best" if labelled else None)
    mem = Panel("resident memory, GiB", xlabel, x_from_zero=True, y_from_zero=True)
    gpu = Panel("GPU utilisation %", xlabel, x_from_zero=True, y_from_zero=True)
    gmem = Panel("GPU memory of the rank, GiB", xlabel, x_from_zero=True, y_from_zero=True)
    for rank in ranks:
        s = samples[rank]
        xs = [x["t"] - t0 for x in s]
        label = f"rank {rank}" if labelled else None
        cpu.series.append(Series(xs, [x["cpu"] for x in s], colours[rank], label))
        mem.series.append(Series(xs, [x["rss"] / GIB for x in s], colours[rank], label))
        with_gpu = [(x["t"] - t0, x["gpus"]) for x in s if x.get("gpus")]
        if with_gpu:
            gx = [t for t, _ in with_gpu]
            gpu.series.append(Series(gx, [max(g["util"] for g in gs) for _, gs in with_gpu], colours[rank], label))
            gmem.series.append(Series(gx, [sum(g["mem"] for g in gs) / GIB for _, gs in with_gpu], colours[rank], label))
    return [cpu, mem] + ([gpu, gmem] if gpu.series else [])


def resources_svg(store: ResourceStore, width: int = 300, height: int = 200,
                  max_points: int | None = None) -> str | None:
    """The panels as one `<svg>`, two a row; None before the first sample."""
    return panels_svg(resource_panels(store.copy(), max_points), width, height)


MIN_SAMPLES = 5  # a run shorter than this many samples (seconds) leaves no chart (a quick cell adds no output)


def resources_png(store: ResourceStore, dpi: int = 80) -> bytes | None:
    """The panels as a PNG, each rank's peak CPU and memory in the legend; None for a short run."""
    samples = store.copy()
    if max((len(s) for s in samples.values()), default=0) < MIN_SAMPLES:
        return None
    panels = resource_panels(samples)
    peaks = {r: (max(x["cpu"] for x in s), max(x["rss"] for x in s) / GIB) for r, s in samples.items() if s}
    ncols = min(len(panels), 2)
    fig, axes = _figure(ncols, math.ceil(len(panels) / ncols))
    for ax, panel in zip(axes, panels, strict=False):
        for series in panel.series:
            rank = int(series.label.split()[-1]) if series.label else None
            label = (f"{series.label}: peak {peaks[rank][0]:.0f}%, {peaks[rank][1]:.2f} GiB"
                     if rank is not None and panel is panels[0] else None)
            ax.plot(series.xs, series.ys, color=series.colour, lw=1, label=label)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel(panel.xlabel, fontsize=8)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
        if panel is panels[0] and panel.legend:
            ax.legend(fontsize=7)
    return png_bytes(fig, dpi)


def show_resources(store: ResourceStore) -> None:
    """The end of a run: the resources chart (an image the saved notebook keeps), and any rank that
    came near its memory limit named."""
    png = resources_png(store)
    if png:
        display({"image/png": base64.b64encode(png).decode("ascii")}, raw=True)
    near = store.near_limit()
    if near:
        print("\n".join(f"jupyter-dist: near its memory limit: {line}" for line in near), flush=True)
