"""`--launcher ssh`: engines started over ssh, one ssh per host, every host at once (`ssh_start.py`); no MPI world.

The connection information travels in the environment (nothing is copied with scp). An engine's
rank follows from the host it is on (its node) and the order of engine ids there (its local rank).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError

from jupyter_dist.cluster import hosts as hostmod
from jupyter_dist.cluster.launchers.base import Launcher
from jupyter_dist.cluster.launchers.ssh_start import parallel_ssh_engine_launcher
from jupyter_dist.common.hosts import source_address


class SshLauncher(Launcher):
    name = "ssh"
    engines = "ssh"  # replaced by `parallel_ssh_engine_launcher()` in `configure`

    def check(self, family: str = "") -> None:
        hosts = self.shape.hosts
        if not hostmod.has_remote(hosts):
            raise UsageError("--launcher ssh starts engines on other hosts: name them with --hosts or --hostfile.")
        if len(set(hosts)) != len(hosts) or any(":" in h for h in hosts):
            raise UsageError("--launcher ssh needs distinct host names or IPv4 addresses in --hosts, one per node.")
        if family == "mpi":
            raise UsageError("-f mpi needs one MPI world, which --launcher ssh does not make: use --launcher mpi.")

    @property
    def remote(self) -> bool:
        return hostmod.has_remote(self.shape.hosts)

    def configure(self, cluster: Any, profile_dir: Path, controller_ip: str) -> list[str]:
        """`-n` engines per host, one ssh per host starting them, the hosts at once."""
        shape = self.shape
        ssh = shlex.split(hostmod.ssh_command(os.environ) or "ssh")
        cluster.engine_launcher_class = parallel_ssh_engine_launcher()
        conf = cluster.config.SSHEngineSetLauncher
        conf.engines = {h: shape.procs_per_host for h in shape.hosts}
        conf.ssh_cmd = ssh
        conf.scp_cmd = ["scp", *ssh[1:]]  # scp reads the same -F/-i/-o options; used for engine logs
        conf.remote_python = sys.executable
        conf.environment = {"PYTHONUNBUFFERED": "1", **hostmod.forwarded_paths(os.environ)}
        conf.engine_args = ["--IPEngine.auto_create=True"]
        cluster.config.SSHEngineLauncher.to_send = []
        return [f"engines on {len(shape.hosts)} hosts ({', '.join(shape.hosts)}) started in parallel, one ssh per host, through "
                f"{' '.join(ssh)}; controller on {controller_ip}"]

    def ranks(self, client: Any, ids: list[int], infos: list[dict[str, Any]], controller_ip: str) -> dict[int, int]:
        """Node by the host the engine is on (its address toward the controller, else its name), local rank by id."""
        shape = self.shape
        ppn = shape.procs_per_host
        where = client[ids].apply_sync(source_address, controller_ip)
        wanted = [(h, hostmod.resolve_host(h)) for h in shape.hosts]
        by_node: dict[int, list[int]] = {}
        for eid, addr, info in zip(ids, where, infos, strict=True):
            node = next((n for n, (h, a) in enumerate(wanted) if addr == a or info["host"] in (h, h.split(".")[0])), None)
            if node is None:
                raise RuntimeError(f"engine {eid} on {info['host']} ({addr}) is on none of --hosts {','.join(shape.hosts)}")
            by_node.setdefault(node, []).append(eid)
        ranks: dict[int, int] = {}
        for node, eids in by_node.items():
            if len(eids) != ppn:
                raise RuntimeError(f"{len(eids)} engines on {shape.hosts[node]}, not {ppn}")
            for local, eid in enumerate(sorted(eids)):
                ranks[eid] = node * ppn + local
        return ranks
