"""When a rank fails or hangs: its stack and crash files, and releasing its peers.

The notebook reads the files (`jupyter_dist.common.files`); it calls `abort_collectives` on a
failed rank so that ranks blocked with it in a collective fail at once instead of timing out.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import os
import signal
import socket
import sys
from collections.abc import Mapping
from typing import IO

import psutil

from jupyter_dist.common.files import crash_file, stack_file
from jupyter_dist.engine.crash_records import usable_folder
from jupyter_dist.engine.torch_hooks import forget_world
from jupyter_dist.engine.zygote_stub import STUB_PID_ENV

_open: dict[str, IO[str]] = {}  # the files faulthandler writes to, kept open for it


def arm_stack_files(stack_dir: str, rank: int) -> None:
    """SIGUSR1 dumps all Python stacks to `rank`'s stack file; a fatal signal (SIGSEGV, SIGFPE,
    SIGABRT, SIGBUS, SIGILL) writes them to its crash file."""
    stack_dir = usable_folder(stack_dir)  # the kernel's folder, else a node-local one (crash_records.py)
    path = stack_file(stack_dir, rank)
    old = _open.pop("stack", None)
    if old is not None:
        old.close()
    fh = open(path, "w")  # noqa: SIM115 - kept open for the signal handler
    os.chmod(path, 0o600)
    _open["stack"] = fh
    faulthandler.register(signal.SIGUSR1, file=fh, all_threads=True)
    crash = open(crash_file(stack_dir, rank), "w")  # noqa: SIM115 - kept open for faulthandler
    os.chmod(crash.name, 0o600)
    _open["crash"] = crash
    faulthandler.enable(file=crash, all_threads=True)


def release_torch_group() -> None:
    """Set-up hook of -f torchrun: a group that an earlier -f pytorch run left on these engines is
    destroyed on every rank alike, so that a later -f pytorch run makes a fresh one everywhere
    (a group gone on some ranks only would leave the others talking to closed pairs)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    forget_world()


def abort_collectives(protected_ports: tuple[int, ...] = ()) -> int:
    """Release this rank's peers from a collective after it failed; returns sockets shut.

    Neither destroying a gloo group nor aborting it closes its TCP pairs while a failed
    collective's traceback still holds them, and a peer blocked in that collective waits
    for its (30 minute) timeout. Shutting this rank's established TCP connections (all but
    those to the ipyparallel controller, `protected_ports`) makes every peer's collective
    fail at once with "connection closed by peer"; the group is replaced on the next
    `init_process_group`.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return 0
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    forget_world()
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            setattr(sys, name, None)
    gc.collect()
    return shut_peer_sockets(set(protected_ports))


def launcher_ports() -> set[int]:
    """Ports the MPI daemon that started this rank listens on (PMIx, Open MPI's out-of-band); a rank
    whose connection to it is shut is ended by Open MPI at its next MPI call. Never a torch peer's.

    The daemon is an ancestor of this process, or, in a forked engine (engine/zygote.py), of its stub:
    the engine is the fork server's child, the stub the daemon's. The PMIx server's port named in the
    environment is counted too, whoever started the rank."""
    ports = pmix_server_ports(os.environ)
    for proc in _launcher_side():
        with contextlib.suppress(psutil.Error):
            ports |= {c.laddr.port for c in proc.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
    return ports


def _launcher_side() -> list[psutil.Process]:
    """This process's ancestors, then its stub and the stub's ancestors where it was forked."""
    procs = psutil.Process().parents()
    stub = os.environ.get(STUB_PID_ENV, "")
    if stub.isdigit():
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(int(stub))
            procs += [proc, *proc.parents()]
    return procs


def pmix_server_ports(env: Mapping[str, str]) -> set[int]:
    """The TCP ports in PMIx's server URIs (`PMIX_SERVER_URI41=prterun-vm-17123@0.0;tcp4://127.0.0.1:55285`)."""
    ports: set[int] = set()
    for key, value in env.items():
        if not key.startswith("PMIX_SERVER_URI"):
            continue
        for part in value.replace(",", ";").split(";"):
            if "://" in part:
                port = part.rsplit(":", 1)[-1].strip("/")
                if port.isdigit():
                    ports.add(int(port))
    return ports


def shut_peer_sockets(protected: set[int], keep_local: set[int] | None = None) -> int:
    """Shut this process's established TCP connections, but those to a port in `protected` and
    those on a local port in `keep_local` (the agent's own)."""
    shut = 0
    protected = protected | launcher_ports()
    for conn in psutil.Process().net_connections(kind="tcp"):
        if conn.status != psutil.CONN_ESTABLISHED or not conn.raddr or conn.fd < 0:
            continue
        if conn.raddr.port in protected or (keep_local and conn.laddr.port in keep_local):
            continue
        with contextlib.suppress(OSError):
            sock = socket.socket(fileno=os.dup(conn.fd))
            try:
                sock.shutdown(socket.SHUT_RDWR)
                shut += 1
            finally:
                sock.close()
    return shut
