"""`--launcher mpi`: every engine under one `mpiexec` (Open MPI), so the engines form one MPI world.

With `--hosts`, mpiexec's launcher (PRRTE) starts its daemons on the other hosts over ssh, from a
host file in the cluster's profile. Engines are mapped to ranks by the MPI rank each reports.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from jupyter_dist.cluster import hosts as hostmod
from jupyter_dist.cluster.launchers.base import Launcher
from jupyter_dist.common.hosts import is_local_host
from jupyter_dist.engine.node_probe import find_mpiexec

_EXIT_CODE = re.compile(r"Process name:\s*\[[^,\]]+,(\d+)\]\s*\n\s*Exit code:\s*(-?\d+)")
_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on\s+signal (\d+)(?: \(([^)]+)\))?")


def open_mpi_env(world_size: int, cores: int, all_local: bool = True) -> tuple[dict[str, str], list[str]]:
    """Variables Open MPI needs for the engines we launch, and the sentences that explain them."""
    env: dict[str, str] = {}
    notes: list[str] = []
    if all_local:
        # one host: shared memory only, so no rank opens a TCP listener on every interface
        env["OMPI_MCA_btl"] = "self,sm"
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        notes.append("running as root: set OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 for mpiexec")
    if world_size > cores:
        env["PRTE_MCA_rmaps_default_mapping_policy"] = ":oversubscribe"
        notes.append(f"{world_size} ranks on {cores} cores: set PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe")
    return env, notes


def parse_death_notes(log: str) -> dict[int, str]:
    """Open MPI 5's (prterun's) messages about a rank that ended the job."""
    notes: dict[int, str] = {}
    for m in _EXIT_CODE.finditer(log):
        notes[int(m.group(1))] = f"exited with code {m.group(2)}"
    for m in _SIGNAL.finditer(log):
        name = f" ({m.group(3)})" if m.group(3) else ""
        notes[int(m.group(1))] = f"was killed by signal {m.group(2)}{name}"
    return notes


def require_mpiexec() -> str:
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise RuntimeError("mpiexec not found")
    return mpiexec


class MpiLauncher(Launcher):
    name = "mpi"
    engines = "mpi"
    ends_job_on_death = False  # --enable-recovery: one rank's death leaves the others running (replacement.py)

    @property
    def remote(self) -> bool:
        return hostmod.has_remote(self.shape.hosts)

    def mpi_env(self) -> tuple[dict[str, str], list[str]]:
        """Open MPI's variables for these engines (unbuffered output included), and the notes on them."""
        # a remote host's slots are its ranks (the host file says so): no oversubscription there
        cores = self.shape.world_size if self.remote else os.cpu_count() or 1
        env, notes = open_mpi_env(self.shape.world_size, cores, all_local=not self.remote)
        env["PYTHONUNBUFFERED"] = "1"
        return env, notes

    def configure(self, cluster: Any, profile_dir: Path, controller_ip: str) -> list[str]:
        env, notes = self.mpi_env()
        mpiexec = require_mpiexec()
        conf = cluster.config.MPIEngineSetLauncher
        conf.mpi_cmd = [mpiexec]
        args = ["--bind-to", "none", "--enable-recovery"]
        if self.remote:
            args += self._remote_args(profile_dir, mpiexec, controller_ip, env, notes)
            # on a host without this profile directory (no shared home), the engine creates it
            conf.engine_args = ["--IPEngine.auto_create=True"]
        conf.mpi_args = args
        conf.environment = env
        return notes

    def _remote_args(
        self, profile_dir: Path, mpiexec: str, controller_ip: str, env: dict[str, str], notes: list[str]
    ) -> list[str]:
        """mpiexec's host file, remote prefix and ssh agent; TCP limited to the network joining the hosts."""
        shape = self.shape
        hostfile = profile_dir / "hostfile"
        hostfile.write_text(hostmod.hostfile_text(shape.hosts, shape.procs_per_host))
        addrs = [hostmod.resolve_host(h) for h in shape.hosts if not is_local_host(h)]
        include = hostmod.include_networks(controller_ip, hostmod.interface_prefixlen(controller_ip), addrs)
        env.update(hostmod.multihost_mpi_env(include, os.environ))
        ssh = hostmod.ssh_command(os.environ)
        notes.append(
            f"engines on {len(shape.hosts)} hosts ({', '.join(shape.hosts)}) started through {ssh or 'ssh'}; "
            f"controller on {controller_ip}; MPI over TCP on {env.get('OMPI_MCA_btl_tcp_if_include', include)}"
        )
        prefix = str(Path(mpiexec).resolve().parent.parent)
        forward = (*hostmod.FORWARD_ENV, *hostmod.forwarded_paths(os.environ))
        return hostmod.mpiexec_host_args(str(hostfile), prefix=prefix, ssh=ssh, forward=forward)

    def ranks(self, client: Any, ids: list[int], infos: list[dict[str, Any]], controller_ip: str) -> dict[int, int]:
        """Each engine's MPI rank, which must be in one world of the run's size."""
        ranks: dict[int, int] = {}
        for eid, info in zip(ids, infos, strict=True):
            rank = info["mpi_rank"]
            if rank is None or info["mpi_size"] != self.shape.world_size:
                raise RuntimeError(f"engine {eid} reports no MPI world of {self.shape.world_size}")
            ranks[eid] = rank
        return ranks

    def death_notes(self, log: str) -> dict[int, str]:
        return parse_death_notes(log)
