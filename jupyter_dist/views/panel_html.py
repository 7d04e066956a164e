"""The panel's HTML pieces: the rank grid, a rank's environment, the summary line, the status line."""

from __future__ import annotations

import html
from typing import Any

from jupyter_dist.plan.layout import Layout
from jupyter_dist.views.preview import Preview

GRID_NODES = 8  # rows and columns the rank grid shows before it elides
GRID_RANKS = 16
BADGE_LIMIT = 64  # ranks the status line shows one by one
STATE_COLORS = {"idle": "#2e7d32", "busy": "#ef6c00", "dead": "#c62828", "starting": "#757575"}


def _state_style(state: str | None) -> str:
    color = STATE_COLORS.get(state or "")
    return f"background:{color};color:white;" if color else ""


def grid_html(layout: Layout, states: dict[int, str] | None = None) -> str:
    """Nodes as rows, local ranks as columns, each cell the global rank (coloured by live state)."""
    states = states or {}
    cols = min(layout.procs_per_node, GRID_RANKS)
    more_cols = layout.procs_per_node - cols
    head = "".join(f"<th>{c}</th>" for c in range(cols)) + ("<th>…</th>" if more_cols else "")
    rows = []
    for n in range(min(layout.nodes, GRID_NODES)):
        first = n * layout.procs_per_node
        cells = "".join(
            f"<td style='text-align:center;padding:2px 6px;{_state_style(states.get(r))}'>{r}</td>"
            for r in range(first, first + cols)
        )
        if more_cols:
            cells += f"<td title='{more_cols} more'>…</td>"
        host = html.escape(layout.hosts[n])
        rows.append(f"<tr><th style='text-align:left'>node {n} <small>{host}</small></th>{cells}</tr>")
    if layout.nodes > GRID_NODES:
        rows.append(f"<tr><td colspan='{cols + 2}'>… {layout.nodes - GRID_NODES} more node(s)</td></tr>")
    return (
        "<table class='jupyter-dist-grid' style='border-collapse:collapse'>"
        f"<tr><th style='text-align:left'>local rank →</th>{head}</tr>{''.join(rows)}</table>"
    )


def env_html(env: dict[str, str]) -> str:
    rows = "".join(
        f"<tr><td><code>{html.escape(k)}</code></td><td><code>{html.escape(v)}</code></td></tr>"
        for k, v in env.items()
    )
    return (
        "<div style='max-height:18em;overflow:auto'><table class='jupyter-dist-env'>"
        f"<tr><th style='text-align:left'>variable</th><th style='text-align:left'>value</th></tr>{rows}</table></div>"
    )


def summary_html(p: Preview) -> str:
    parts = []
    if p.spec is not None:
        s = p.spec
        parts.append(
            f"<b>world size {s.world_size}</b> = {s.nodes} node(s) × {s.procs_per_node} process(es) per node"
            f" · backend {html.escape(p.backend or s.backend)} · launcher {html.escape(s.launcher)}"
            f" · timeout {'none' if s.timeout is None else f'{s.timeout:g} s'}"
        )
    if p.problem:
        parts.append(f"<span style='color:#c62828'>a %%distrun without flags would fail: {html.escape(p.problem)}</span>")
    parts += [f"<span style='color:#757575'>{html.escape(n)}</span>" for n in p.notes]
    return "<br>".join(parts)


def status_html(st: dict[str, Any], message: str = "") -> str:
    """The live status line: cluster state, engines up, and each rank's state."""
    state = str(st.get("state", "error"))
    head = (
        f"<b>cluster: <span style='{_state_style(state)}padding:0 4px'>{html.escape(state)}</span></b>"
        f" · {int(st.get('engines') or 0)}/{int(st.get('expected') or 0)} engines up"
    )
    if st.get("launcher"):
        head += f" · via {html.escape(str(st['launcher']))}"
    ranks = [r for r in st.get("ranks") or [] if isinstance(r, dict)]
    if ranks:
        counts: dict[str, int] = {}
        for r in ranks:
            counts[str(r.get("state"))] = counts.get(str(r.get("state")), 0) + 1
        head += " · " + ", ".join(f"{n} {html.escape(s)}" for s, n in sorted(counts.items()))
        if len(ranks) <= BADGE_LIMIT:
            head += "<br>" + " ".join(
                f"<span style='{_state_style(str(r.get('state')))}padding:0 4px;border-radius:3px'"
                f" title='{html.escape(str(r.get('host', '')))}'>rank {int(r.get('rank', -1))} "
                f"{html.escape(str(r.get('state')))}</span>"
                for r in ranks
            )
    for text in (st.get("message"), message):
        if text:
            head += f"<br><span style='color:#c62828'>{html.escape(str(text))}</span>"
    return head


def port_note(p: Preview) -> str:
    """Under a rank's environment while its MASTER_PORT is torchrun's default standing in."""
    if p.real_port or p.ports is None:
        return ""
    return (
        f"<br><small>MASTER_PORT {p.ports.master} is a placeholder: the real port is chosen "
        "when the engines start.</small>"
    )
