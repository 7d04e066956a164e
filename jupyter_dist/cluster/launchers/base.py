"""`Launcher`: one way of starting the engines (`--launcher NAME`), as ipyparallel has a class per launcher.

The cluster makes one for each start and asks it, in this order: `check` (before anything
starts), `remote` (engines on other hosts: the controller then listens on the network that joins
them), `configure` (the unstarted `ipyparallel.Cluster`: its engine launcher and the engines'
environment), `ranks` (which engine is which rank once they are up); and while they run,
`running`, `death_notes`, and `watchdog_tokens` (what to stop besides local processes).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import psutil

from jupyter_dist.cluster.shape import ClusterShape


class Launcher(ABC):
    """Starts the engines of one shape; a subclass per `--launcher` name."""

    name: ClassVar[str]
    engines: ClassVar[str] = "local"  # ipyparallel's engine launcher (`ipyparallel.Cluster(engines=...)`)
    # whether one engine's death ends the others (mpiexec's default), and the launcher then says how it died
    ends_job_on_death: ClassVar[bool] = True

    def __init__(self, shape: ClusterShape) -> None:
        self.shape = shape

    def check(self, family: str = "") -> None:  # noqa: B027 - most launchers start any shape
        """Raise `UsageError`, naming the flag, for a shape this launcher cannot start."""

    @property
    def remote(self) -> bool:
        """Whether engines run on other hosts (then each node is probed for its address and ports)."""
        return False

    def probed_nodes(self) -> int:
        """How many nodes to ask, once the engines are up, for their address, fabric and free ports
        (`engine.node_probe.node_view` on each node's first engine); 0: every node is this host."""
        return len(self.shape.hosts) if self.remote else 0

    @abstractmethod
    def configure(self, cluster: Any, profile_dir: Path, controller_ip: str) -> list[str]:
        """Set up an unstarted `ipyparallel.Cluster`; returns what the user should be told."""

    @abstractmethod
    def ranks(self, client: Any, ids: list[int], infos: list[dict[str, Any]], controller_ip: str) -> dict[int, int]:
        """engine id -> rank, from what each engine said of itself (`engine.setup.identify`)."""

    def running(self, engine_set: Any) -> bool:
        """Whether the engines' launcher process (mpiexec) is still there; False where there is none."""
        pid = getattr(engine_set, "pid", None)
        if not pid or pid < 0:  # none, or an ssh engine set (no local process)
            return False
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def death_notes(self, log: str) -> dict[int, str]:
        """rank -> how it died ('exited with code 3'), as the launcher's log tells it."""
        return {}

    def watchdog_tokens(self, engine_set: Any) -> list[str]:
        """What the watchdog stops besides local pids should the kernel die (`slurm:ID`)."""
        return []
