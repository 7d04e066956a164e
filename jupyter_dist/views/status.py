"""`%dist status`: the cluster as a table, plain text (and HTML in a notebook)."""

from __future__ import annotations

import html
from typing import Any


def status_text(st: dict[str, Any]) -> str:
    head = (
        f"cluster: {st['state']}  engines: {st['engines']}/{st['expected']}  "
        f"framework: {st.get('framework')}  layout: {st.get('nodes')} node(s) x {st.get('procs_per_node')}"
    )
    if st.get("launcher"):
        head += f"  launcher: {st['launcher']}"
    rows = ["rank  node  local  engine  pid      host              state"]
    for r in st.get("ranks", []):
        rows.append(
            f"{r['rank']:<5} {r.get('node', '-')!s:<5} {r.get('local_rank', '-')!s:<6} {r['engine_id']:<7} "
            f"{r['pid']:<8} {r['host']:<17} {r['state']}"
        )
    return "\n".join([head, *rows]) if st.get("ranks") else head


def status_html(st: dict[str, Any]) -> str:
    cells = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(r.get(k, '-')))}</td>" for k in
                         ("rank", "node", "local_rank", "engine_id", "pid", "host", "state")) + "</tr>"
        for r in st.get("ranks", [])
    )
    head = html.escape(status_text({**st, "ranks": []}))
    table = (
        "<table><tr><th>rank</th><th>node</th><th>local rank</th><th>engine</th><th>pid</th>"
        f"<th>host</th><th>state</th></tr>{cells}</table>" if cells else ""
    )
    return f"<div class='jupyter-dist-status'><pre>{head}</pre>{table}</div>"


def show_status(st: dict[str, Any]) -> None:
    from IPython.display import display

    display({"text/plain": status_text(st), "text/html": status_html(st)}, raw=True)
