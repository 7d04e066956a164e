"""Dead ranks' crash records: from the state folder when the kernel shares it with the node, else
asked of the live ranks on the same node, whose agents read the node's files (engine/crash_records.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jupyter_dist.common.files import read_crash
from jupyter_dist.common.hosts import is_local_host

ASK_TIMEOUT_S = 2.0


def crash_records(cluster: Any, ranks: Iterable[int], dead: Iterable[int] = (),
                  timeout: float = ASK_TIMEOUT_S) -> dict[int, str]:
    """rank -> what faulthandler wrote when it died ('' where nothing); `dead`: ranks not to ask."""
    ranks = list(ranks)
    found = {r: read_crash(cluster.stack_dir, r) for r in ranks}
    missing = [r for r in ranks if not found[r].strip()]
    addresses = dict(cluster.agents.addresses)
    gone = set(dead) | set(ranks)
    by_host: dict[str, list[int]] = {}
    for r in missing:
        if r in addresses:
            by_host.setdefault(addresses[r].host, []).append(r)
    for host, wanted in by_host.items():
        if is_local_host(host):
            continue  # this host's ranks write where the kernel just read
        peers = [p for p, a in addresses.items() if a.host == host and p not in gone]
        if not peers:
            continue
        answers = cluster.agents.ask("crash", peers, {"ranks": wanted}, timeout=timeout)
        for got in answers.results.values():
            for r in wanted:
                text = (got or {}).get(str(r), "")
                if text.strip() and not found[r].strip():
                    found[r] = text
    return found
