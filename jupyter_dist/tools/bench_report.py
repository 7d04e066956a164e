"""`%dist bench allreduce`'s report in the kernel: the nccl-tests style table, its HTML and a chart.

The rows come from `jupyter_dist.engine.probes.allreduce_bench` (one dict per message size).
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from typing import Any

__all__ = ["chart_png", "format_bytes", "format_table", "to_html"]

Row = dict[str, Any]


def format_bytes(n: int) -> str:
    """8 -> "8 B", 2048 -> "2 KiB", 67108864 -> "64 MiB"."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:g} {unit}"
        value /= 1024
    return f"{n} B"


def _avg_busbw(rows: Sequence[Row]) -> float:
    return sum(r["busbw_GBps"] for r in rows) / len(rows) if rows else 0.0


def format_table(rows: Sequence[Row], world_size: int, backend: str) -> str:
    """The rows as nccl-tests prints them (size, count, type, redop, time, algbw, busbw, #wrong)."""
    lines = [
        f"# all_reduce, {world_size} rank{'s' if world_size != 1 else ''}, backend {backend}",
        "#",
        f"#{'size':>11} {'count':>12} {'type':>8} {'redop':>6} {'time':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>7}",
        f"#{'(B)':>11} {'(elements)':>12} {'':>8} {'':>6} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8}",
    ]
    for r in rows:
        lines.append(
            f" {r['size_bytes']:>11} {r['count']:>12} {r.get('dtype', 'float32').replace('float32', 'float'):>8}"
            f" {'sum':>6} {r['time_us']:>10.1f} {r['algbw_GBps']:>8.2f} {r['busbw_GBps']:>8.2f} {r.get('wrong', 0):>7}"
        )
    wrong = sum(int(r.get("wrong", 0)) for r in rows)
    lines.append(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    lines.append(f"# Avg bus bandwidth    : {_avg_busbw(rows):.4g} GB/s")
    return "\n".join(lines)


def to_html(rows: Sequence[Row], world_size: int, backend: str) -> str:
    """The same table as HTML for the notebook."""
    head = ["size", "count", "type", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong"]
    out = [
        '<table class="jupyter-dist-bench">',
        f"<caption>all_reduce, {world_size} rank{'s' if world_size != 1 else ''}, "
        f"backend {html.escape(backend)}</caption>",
        "<thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead>",
        "<tbody>",
    ]
    for r in rows:
        cells = [
            format_bytes(r["size_bytes"]),
            str(r["count"]),
            html.escape(str(r.get("dtype", "float32"))),
            f"{r['time_us']:.1f}",
            f"{r['algbw_GBps']:.2f}",
            f"{r['busbw_GBps']:.2f}",
            str(r.get("wrong", 0)),
        ]
        out.append("<tr>" + "".join(f'<td style="text-align:right">{c}</td>' for c in cells) + "</tr>")
    out.append("</tbody>")
    out.append(
        f"<tfoot><tr><td colspan=7>average bus bandwidth {_avg_busbw(rows):.4g} GB/s</td></tr></tfoot>"
    )
    out.append("</table>")
    return "\n".join(out)


def chart_png(
    rows: Sequence[Row], local_copy_gbps: float | None = None, *, title: str | None = None
) -> bytes:
    """Bus bandwidth against message size (log x) with the local-copy ceiling, as PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # heavy and optional: only for a chart
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    fig = Figure(figsize=(6.4, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs = [r["size_bytes"] for r in rows]
    ax.plot(xs, [r["busbw_GBps"] for r in rows], marker="o", label="bus bandwidth")
    ax.plot(xs, [r["algbw_GBps"] for r in rows], marker=".", linestyle=":", label="algorithm bandwidth")
    if local_copy_gbps:
        ax.axhline(
            local_copy_gbps, color="grey", linestyle="--", label=f"local copy {local_copy_gbps:.3g} GB/s"
        )
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: format_bytes(int(v)) if v >= 1 else ""))
    ax.set_xlabel("message size")
    ax.set_ylabel("GB/s")
    ax.set_title(title or "all_reduce bandwidth")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
