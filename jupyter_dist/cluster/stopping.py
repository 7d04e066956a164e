"""Ranks still stopping after a `--timeout` was reported: kept if they stop, else killed and replaced.

A `--timeout` is reported as soon as every rank's stack is in hand and the ranks are released (run/hangs.py),
not after `interrupt_grace`: a rank that has not stopped by then is watched here by a thread, for the
rest of `interrupt_grace`. A rank that stops in that time keeps its variables; one that does not (an MPI
collective waits in Open MPI's C loop, which no signal's handler can leave) is killed then. The next run
first waits for that thread (`settle`, from `EngineCluster.ensure`), so that no cell is queued behind a
rank still stopping, and starts the killed ranks' replacements, which it then gives their ranks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jupyter_dist.cluster import replacement
from jupyter_dist.common.hosts import is_local_host

if TYPE_CHECKING:
    from jupyter_dist.cluster.engines import EngineCluster

POLL_S = 0.05


@dataclass
class Stopping:
    """The ranks being watched, their engines' pids (local ones: the others cannot be killed from here)."""

    pids: dict[int, int]
    deadline: float
    killed: list[int] = field(default_factory=list)
    stopped: list[int] = field(default_factory=list)
    cancelled: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def watch(self, cells: Mapping[int, Any]) -> None:
        """Thread body: wait until each rank's cell (an ipyparallel result) is done or the deadline; kill
        the engines of the ranks still running then."""
        while time.monotonic() < self.deadline and not self.cancelled.is_set():
            if all(c.done() for c in cells.values()):
                break
            time.sleep(POLL_S)
        if self.cancelled.is_set():
            return
        for rank, c in sorted(cells.items()):
            if c.done():
                self.stopped.append(rank)
                continue
            with contextlib.suppress(OSError):
                os.kill(self.pids[rank], signal.SIGKILL)
            self.killed.append(rank)


def watch(cluster: EngineCluster, cells: Mapping[int, Any], deadline: float) -> Stopping:
    """Watch these ranks' cells (rank -> ipyparallel result) until `deadline` in a thread of their own."""
    cancel(cluster)
    pids = {r: cluster.engines[r].pid for r in cells if is_local_host(cluster.engines[r].host)}
    local = {r: c for r, c in cells.items() if r in pids}
    st = Stopping(pids, deadline)
    st.thread = threading.Thread(target=st.watch, args=(local,), name="jupyter-dist-stopping", daemon=True)
    st.thread.start()
    cluster.pending_stop = st
    return st


def settle(cluster: EngineCluster, start: bool = True) -> list[int]:
    """Before a run: wait for the ranks still stopping (until the deadline), then start replacements for
    those that were killed (the run's `replace_dead` gives them their ranks; not with `start` False: the
    caller restarts the cluster). Returns the killed ranks."""
    st: Stopping | None = cluster.pending_stop
    if st is None:
        return []
    cluster.pending_stop = None
    if st.thread is not None:
        st.thread.join(max(0.0, st.deadline - time.monotonic()) + 1.0)
    if st.killed and start and cluster.running:
        with contextlib.suppress(Exception):  # the run's replace_dead (or a restart) handles it anyway
            replacement.start_spares(cluster, st.killed, only_if_replaceable=True)
    return st.killed


def cancel(cluster: EngineCluster) -> None:
    """The cluster stops or restarts: nothing left to watch."""
    st: Stopping | None = cluster.pending_stop
    if st is not None:
        st.cancelled.set()
        cluster.pending_stop = None
