"""What `%load_ext jupyter_dist` starts ahead of the first cell.

Always: this host's probe (`session.local_node()`: GPUs, MPI, fabric) and the import of ipyparallel,
in a thread of the kernel; no process of a cluster. With `DistSettings.background_start` (off by
default; `JUPYTER_DIST_BACKGROUND_START=1`): the engines too, with the panel's layout (its stored
defaults), on this host only, in a thread (`cluster/background.py`); one line says so. The first
`%%distrun` then waits only for what is left of the start; a cell of another layout restarts them,
saying so in one line (`EngineCluster.ensure`).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from jupyter_dist import frameworks
from jupyter_dist.cluster import preload
from jupyter_dist.plan.settings import settings

LOCAL_LAUNCHERS = ("mpi", "local")


def prewarm(session: Any) -> threading.Thread:
    """The host probe and ipyparallel's import, in a daemon thread (each a second or two of a cold first cell)."""

    def run() -> None:
        with contextlib.suppress(Exception):  # the first cell does it again and reports what fails
            session.local_node()
        with contextlib.suppress(Exception):
            import ipyparallel  # noqa: F401 - heavy: imported ahead of the first cell, in this thread

    t = threading.Thread(target=run, name="jupyter-dist-prewarm", daemon=True)
    t.start()
    return t


def background_line(session: Any) -> str | None:
    """Start the engines in the background when the setting says so; the line that says what was done."""
    if not settings().background_start:
        return None
    shape = session.default_shape()
    if shape.launcher not in LOCAL_LAUNCHERS or shape.hosts:
        return (f"jupyter-dist: engines not started in the background: the panel's layout uses --launcher "
                f"{shape.launcher}{' on other hosts' if shape.hosts else ''} (only mpi or local on this host are)")
    framework = session.store.value.framework or "pytorch"
    with contextlib.suppress(Exception):
        session.cluster.preload = preload.modules_for(frameworks.get(framework).family)
    session.cluster.start_in_background(shape)
    return (f"jupyter-dist: starting {shape.world_size} engines in the background ({shape.launcher}, the panel's "
            f"layout); the first %%distrun waits only for what is left (off: JUPYTER_DIST_BACKGROUND_START=0 "
            f"or c.DistSettings.background_start = False)")


def at_load(ipython: Any, session: Any) -> str | None:
    """Called by `load_ipython_extension`: the settings reach `%config` and the shell's config file,
    the prewarm starts, and the engines when the setting says so."""
    s = settings()
    with contextlib.suppress(Exception):
        s.update_config(ipython.config)
        if s not in ipython.configurables:
            ipython.configurables.append(s)
    prewarm(session)
    return background_line(session)
