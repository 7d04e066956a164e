"""The node's engine fork server (`engine/zygote.py`): started before mpiexec, stopped with the cluster.

Only for `--launcher mpi` with every rank on this host (`DistSettings.fork_engines`): mpiexec then
starts a stub per rank (`engine/zygote_stub.py`) in place of `ipengine`, and each engine is forked
from a process that imported the engine stack (and torch, for a torch framework) once. The ranks
are still one MPI world of mpiexec's: a forked engine's MPI_Init meets mpiexec's PMIx server with
the stub's environment. Spares started later (cluster/replacement.py) go through the same stub.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_dist.cluster.session_weight import SessionWeight
from jupyter_dist.common.crowding import crowded
from jupyter_dist.common.process_group import own_group
from jupyter_dist.engine import zygote_stub
from jupyter_dist.plan.settings import settings

_SOCKET_MAX = 100  # a unix socket's path is limited to 107 bytes on Linux
CROWDED_SESSION = "JUPYTER_DIST_CROWDED_SESSION"  # "0": a crowded node's server in the kernel's session too


@dataclass
class ForkServer:
    """One started fork server: its process and the socket its stubs connect to."""

    proc: subprocess.Popen
    socket: str
    folder: Path
    weight: SessionWeight | None = None  # its session's, where it leads one (cluster/session_weight.py)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stub_cmd(self) -> list[str]:
        """What mpiexec starts per rank: ipyparallel appends `--mpi` and the engine's arguments."""
        return [sys.executable, "-I", "-S", zygote_stub.__file__, self.socket]

    def stop(self) -> None:
        """SIGTERM (the server kills its engines and exits), then SIGKILL if it lingers."""
        with contextlib.suppress(Exception):
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def wanted(launcher: str, remote: bool) -> bool:
    """Fork engines for this start: `--launcher mpi`, every rank on this host, the setting on."""
    return launcher == "mpi" and not remote and bool(settings().fork_engines)


def socket_folder(profile_dir: Path) -> Path:
    """A 0700 folder for the socket: in the profile, else (a path too long) a private temp folder."""
    folder = profile_dir / "zygote"
    if len(str(folder / "s")) > _SOCKET_MAX:
        return Path(tempfile.mkdtemp(prefix="jd-zygote-"))
    folder.mkdir(mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    return folder


def start(profile_dir: Path, env: dict[str, str], modules: tuple[str, ...],
          new_session: bool = False) -> ForkServer:
    """Start the server with the engines' environment; it imports while mpiexec starts (the stubs wait).

    `new_session`: in a session of its own, which the engines it forks keep where the node is crowded
    (engine/sessions.py): all the node's ranks then weigh one session beside the kernel's, as
    ipyparallel's engines do (`JUPYTER_DIST_CROWDED_SESSION=0` in the kernel's environment: never,
    for measuring the difference). Else a group of its own in the kernel's session (the kernel's
    interrupts are not its); the engines then take sessions of their own."""
    folder = socket_folder(profile_dir)
    sock = str(folder / "s")
    log = open(folder / "zygote.log", "ab")  # noqa: SIM115 - the child holds it; closed below
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_dist.engine.zygote", sock, str(os.getpid()), *modules],
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            **({"start_new_session": True} if new_session else own_group()),
        )
    finally:
        log.close()
    return ForkServer(proc, sock, folder)


def configure(cluster: Any, profile_dir: Path, modules: tuple[str, ...]) -> ForkServer:
    """Start a server for an unstarted `ipyparallel.Cluster` and make mpiexec start stubs."""
    conf = cluster.config.MPIEngineSetLauncher
    env = dict(conf.environment) if "environment" in conf else {}
    apart = os.environ.get(CROWDED_SESSION) != "0" and crowded(cluster.n, len(os.sched_getaffinity(0)))
    server = start(profile_dir, env, modules, new_session=apart)
    if apart:
        server.weight = SessionWeight(server.pid)
    conf.engine_cmd = server.stub_cmd()
    return server
