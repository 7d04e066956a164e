"""The agent's "collectives": this rank's record (collective_record.py), and its workers' while any runs.

The record counts from each cell's start, alike on every rank of the run. While the engine waits on
workers of its own (--fresh's child, torchrun's workers: engine/workers.py), the answer carries
theirs under "workers", each with its rank (None: this engine's), asked on their sockets
(worker_collectives.py); run/desync.py's `records_by_rank` takes them as their ranks'.
"""

from __future__ import annotations

from typing import Any

from jupyter_dist.engine import agent, collective_record, worker_collectives, workers
from jupyter_dist.engine.cells import BEFORE_CELL, add_hook
from jupyter_dist.engine.collective_record import _recorded, install, reset

__all__ = ["_recorded", "install", "register", "reset", "snapshot"]


def snapshot(_: dict[str, Any] | None = None) -> dict[str, Any]:
    """{"in_flight", "done", "now"} of this engine, with "workers": [{"rank", "pid", ...}] while any runs."""
    own = collective_record.snapshot()
    found = workers.workers()
    if found:
        own["workers"] = worker_collectives.ask(found)
    return own


def register() -> None:
    install()
    add_hook(BEFORE_CELL, reset)
    agent.register("collectives", snapshot)
