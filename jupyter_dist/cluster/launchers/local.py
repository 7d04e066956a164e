"""`--launcher local`: one `ipengine` process per rank on this host, no MPI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from IPython.core.error import UsageError

from jupyter_dist.cluster import hosts as hostmod
from jupyter_dist.cluster.launchers.base import Launcher


class LocalLauncher(Launcher):
    name = "local"
    engines = "local"
    ends_job_on_death = False

    def check(self, family: str = "") -> None:
        if hostmod.has_remote(self.shape.hosts):
            raise UsageError("--launcher local starts engines on this host only: use --launcher mpi with --hosts.")

    def configure(self, cluster: Any, profile_dir: Path, controller_ip: str) -> list[str]:
        cluster.config.LocalEngineSetLauncher.environment = {"PYTHONUNBUFFERED": "1"}
        return []

    def ranks(self, client: Any, ids: list[int], infos: list[dict[str, Any]], controller_ip: str) -> dict[int, int]:
        """In the order the engines registered."""
        return {eid: ids.index(eid) for eid in ids}
