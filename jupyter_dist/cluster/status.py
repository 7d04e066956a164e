"""A fan-out for the cluster's single `on_status` callable.

The sidebar's comm, every open panel and anything else that follows the cluster's status add
themselves here, so that none replaces another (a second `%load_ext`, a panel opened before
the comm was registered).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol


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
