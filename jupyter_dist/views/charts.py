"""Charts: matplotlib's Agg canvas to PNG bytes, for the image a run leaves in the notebook.

No pyplot (so the user's backend and figures are untouched) and no JupyterLab extension: the
static chart is an image/png display with a fixed text/plain beside it (nbval skips image/png by
default and compares the text). The live chart during a run draws the same panels as an inline
SVG in an `ipywidgets.HTML` (views/svg_chart.py): a few milliseconds a redraw instead of ~0.1 s
of CPU that the ranks would lose.

Chosen over plotly (its static image needs kaleido and a browser), bqplot and ipympl (live, but
each needs its own JupyterLab extension and leaves no image in a saved notebook) and altair (a
static image needs vl-convert): matplotlib is one wheel from PyPI and already needed.
"""

from __future__ import annotations

import base64
import io
import math
from typing import Any

from IPython.display import display

from jupyter_dist.run.metrics_store import MetricsStore, ScalingResult

MAX_SCALARS = 3
MAX_LEGEND_RANKS = 8


def _figure(ncols: int, nrows: int = 1) -> tuple[Any, list[Any]]:
    """A figure on its own Agg canvas (no pyplot: the user's figures and backend are untouched)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # heavy: imported by the first chart
    from matplotlib.figure import Figure  # heavy: imported by the first chart

    fig = Figure(figsize=(4.6 * ncols, 3.0 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(nrows, ncols, i + 1) for i in range(ncols * nrows)]
    return fig, axes


def png_bytes(fig: Any, dpi: int = 90) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def metrics_figure(store: MetricsStore) -> Any | None:
    """Throughput by rank and their sum over time, then each scalar (up to 3) by rank over steps."""
    centres, by_rank, total = store.rate_series()
    scalars = [n for n in store.scalar_names() if store.scalar_series(n)][:MAX_SCALARS]
    if not centres and not scalars:
        return None
    n = 1 + len(scalars)
    ncols = min(n, 2)
    nrows = math.ceil(n / ncols)
    fig, axes = _figure(ncols, nrows)
    unit = f"{store.unit}/s"
    ax = axes[0]
    legend = len(by_rank) <= MAX_LEGEND_RANKS
    for rank, rates in by_rank.items():
        ax.plot(centres, rates, lw=1, alpha=0.8, label=f"rank {rank}" if legend else None)
    if len(by_rank) > 1:
        ax.plot(centres, total, color="black", lw=2, label="sum")
    ax.set_title(unit + (" (optimizer steps)" if store.source == "auto" else ""), fontsize=10)
    # from the first record, so a launcher's start-up (torchrun's) does not crowd the training out
    ax.set_xlabel("seconds since the first " + ("report()" if store.source == "report" else "optimizer step"))
    ax.set_ylim(bottom=0)
    if not centres:
        ax.text(0.5, 0.5, "not enough points yet", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.set_xlim(left=0)
        if by_rank:
            ax.legend(fontsize=7, loc="lower right")
    for ax, name in zip(axes[1:], scalars, strict=False):
        for rank, (xs, ys) in store.scalar_series(name).items():
            ax.plot(xs, ys, lw=1, alpha=0.8, label=f"rank {rank}" if legend else None)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        if legend:
            ax.legend(fontsize=7)
    for ax in axes[n:]:
        ax.set_visible(False)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    return fig


def metrics_png(store: MetricsStore, dpi: int = 90) -> bytes | None:
    fig = metrics_figure(store)
    return png_bytes(fig, dpi) if fig is not None else None


def metrics_caption(store: MetricsStore) -> str:
    """The chart's text/plain: fixed for the same cell, so a saved notebook compares equal."""
    scalars = [n for n in store.scalar_names() if store.scalar_series(n)][:MAX_SCALARS]
    what = f"{store.unit}/s by rank" + (" and their sum" if len(store.ranks) > 1 else "")
    if scalars:
        what += "; " + ", ".join(scalars) + " by step"
    return f"<jupyter-dist chart: {what}; {len(store.ranks)} rank(s)>"


def show_png(png: bytes, caption: str) -> None:
    display({"image/png": base64.b64encode(png).decode("ascii"), "text/plain": caption}, raw=True)


def show_metrics(store: MetricsStore) -> None:
    """The end of a run: the static chart, then the summary."""
    png = metrics_png(store)
    if png:
        show_png(png, metrics_caption(store))
    print("\n".join(store.summary().lines()), flush=True)


def scaling_figure(result: ScalingResult) -> Any:
    fig, (ax1, ax2) = _figure(2)
    sizes = [p.world_size for p in result.points]
    base = result.base
    ax1.plot(sizes, [p.throughput for p in result.points], "o-", label="measured")
    ax1.plot(sizes, [base.throughput * result.ideal(p) for p in result.points], "--", color="gray", label="ideal (linear)")
    ax1.set_title(f"throughput ({result.unit})", fontsize=10)
    ax2.plot(sizes, [result.speedup(p) for p in result.points], "o-", label="measured")
    ax2.plot(sizes, [result.ideal(p) for p in result.points], "--", color="gray", label="ideal")
    for p in result.points:
        ax2.annotate(f"{100 * result.efficiency(p):.0f}%", (p.world_size, result.speedup(p)),
                     textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ax2.set_title(f"speedup over world size {base.world_size} (labels: efficiency)", fontsize=10)
    for ax in (ax1, ax2):
        ax.set_xlabel("world size (ranks)")
        ax.set_xticks(sizes)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.tick_params(labelsize=8)
    return fig


def show_scaling(result: ScalingResult) -> None:
    sizes = ",".join(str(p.world_size) for p in result.points)
    show_png(png_bytes(scaling_figure(result)), f"<jupyter-dist scaling chart: world sizes {sizes}; {result.unit}>")
    print("\n".join(result.lines()), flush=True)
