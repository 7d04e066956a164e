"""Engines started in a thread, at `%load_ext` when `DistSettings.background_start` is on.

The first cell then waits only for what is left of the start (`wait`, called by every
`EngineCluster` method that needs the engines settled). The start runs inside an asyncio loop of
its own thread, so that ipyparallel's `_sync` calls go to ipyparallel's own loop thread exactly as
they do from the kernel's main thread (where a loop is running): the launchers' process watchers
stay on a loop that lives on. `EngineCluster` is driven by one thread at a time: the kernel's main
thread joins this one before it touches the cluster.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jupyter_dist.cluster.shape import ClusterShape

if TYPE_CHECKING:
    from jupyter_dist.cluster.engines import EngineCluster


@dataclass
class BackgroundStart:
    shape: ClusterShape
    thread: threading.Thread | None = None
    error: BaseException | None = None
    started: float = field(default_factory=time.monotonic)
    seconds: float = 0.0  # how long the start took (0 while it runs)


def start(cluster: EngineCluster, shape: ClusterShape) -> BackgroundStart:
    """Start `cluster`'s engines of `shape` in a daemon thread; returns at once."""
    bg = BackgroundStart(shape)

    async def in_a_loop() -> None:
        cluster.start(shape)
        cluster.from_background = True

    def run() -> None:
        try:
            asyncio.run(in_a_loop())
        except BaseException as e:  # noqa: BLE001 - told to the first cell, which starts them itself
            bg.error = e
        bg.seconds = time.monotonic() - bg.started

    bg.thread = threading.Thread(target=run, name="jupyter-dist-background-start", daemon=True)
    cluster.background = bg
    bg.thread.start()
    return bg


def wait(cluster: EngineCluster, say: Callable[[str], None] | None = None) -> BackgroundStart | None:
    """Join a start in the background, if there is one; it is then forgotten. Returns it (None when
    there was none, or when called by the start itself, which stops the cluster when it fails)."""
    bg = cluster.background
    if bg is None or bg.thread is None or threading.current_thread() is bg.thread:
        return None
    if bg.thread.is_alive() and say is not None:
        say(f"waiting for the {bg.shape.world_size} engines started in the background "
            f"({time.monotonic() - bg.started:.1f} s ago)")
    bg.thread.join()
    cluster.background = None
    if bg.error is not None and say is not None:
        first = str(bg.error).strip().splitlines()[:1] or [type(bg.error).__name__]
        say(f"the engines started in the background did not start ({first[0]}): starting them now")
    return bg
