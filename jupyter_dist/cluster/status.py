"""A fan-out for the cluster's single `on_status` callable.

The sidebar's comm, every open panel and anything else that follows the cluster's status add
themselves here, so that none replaces another (a second `%load_ext`, a panel opened before
the comm was registered).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from jupyter_dist.cluster.processes import pid_alive
from jupyter_dist.common.hosts import is_local_host


class HasStatusCallback(Protocol):
    on_status: Callable[[], None] | None


class StatusListeners:
    """A callable that stands in `EngineCluster.on_status` and calls every listener in turn."""

    def __init__(self, first: Callable[[], None] | None = None) -> None:
        self.listeners: list[Callable[[], None]] = [first] if first is not None else []

    def __call__(self) -> None:
        for listener in list(self.listeners):
            with contextlib.suppress(Exception):  # one broken view never stops the others
                listener()


def add_status_listener(cluster: HasStatusCallback | Any, listener: Callable[[], None]) -> Callable[[], None]:
    """Add `listener` next to whatever `cluster.on_status` already calls (once); returns the remover."""
    fanout = cluster.on_status
    if not isinstance(fanout, StatusListeners):
        fanout = StatusListeners(fanout)
        cluster.on_status = fanout
    if listener not in fanout.listeners:
        fanout.listeners.append(listener)

    def remove() -> None:
        if listener in fanout.listeners:
            fanout.listeners.remove(listener)

    return remove


def status_of(state: str, shape: Any, engines: Iterable[Any], alive_ids: set[int], busy: bool) -> dict[str, Any]:
    """The cluster's status as `%dist status`, the panel and the sidebar show it: a rank is dead when its
    engine left the controller or (on this host) its process is gone."""
    ranks = []
    for e in engines:
        dead = e.engine_id not in alive_ids or (is_local_host(e.host) and not pid_alive(e.pid))
        ranks.append({"rank": e.rank, "engine_id": e.engine_id, "pid": e.pid, "host": e.host,
                      "state": "dead" if dead else ("busy" if busy else "idle")})
    return {
        "state": state,
        "engines": len(alive_ids),
        "expected": shape.world_size if shape else 0,
        "launcher": shape.launcher if shape else None,
        "hosts": list(shape.hosts) if shape else [],
        "ranks": ranks,
    }
