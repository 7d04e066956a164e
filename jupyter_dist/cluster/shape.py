"""`ClusterShape`: what a set of engines is (launcher, world size, hosts); a change means new engines."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClusterShape:
    launcher: str
    world_size: int
    hosts: tuple[str, ...]
    # --launcher slurm only: the job's node count and sbatch options (a change means a new job)
    slurm_nodes: int = 0
    slurm: tuple[tuple[str, str], ...] = ()

    @property
    def procs_per_host(self) -> int:
        """Engines on each of `hosts` (one node per host)."""
        return self.world_size // len(self.hosts)

    def describe(self) -> str:
        return f"{self.world_size} ranks via {self.launcher}"
