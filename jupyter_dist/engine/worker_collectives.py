"""The collectives of a rank's worker process (--fresh's child, torchrun's workers), asked on demand.

A worker records its collectives with the engine's recorder (collective_record.py: in memory, a few
microseconds a call) and answers on a unix socket of its own, `<dir>/<pid>.sock`, where `dir` is
the one its engine made and passed in `SOCKETS_VAR`: one connection, one JSON line back (the
record's `snapshot`), from a thread of the worker's, so it answers while the main thread waits in
a collective. Nothing crosses the socket until the engine's agent asks (`ask`), so the training
pays for the record only. The folder is the engine's own (mode 0700): no token is needed.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import socket
import tempfile
import threading
from typing import Any

from jupyter_dist.common.agent_wire import read_line
from jupyter_dist.engine import collective_record

SOCKETS_VAR = "JUPYTER_DIST_WORKER_SOCKETS"
ASK_S = 0.5  # for one worker's answer: the notebook gives a rank's agent about a second
MAX_ANSWER = 1 << 20
_dir: dict[str, str] = {}


def sockets_dir() -> str:
    """This engine's folder for its workers' sockets (made once, removed when the engine exits)."""
    if "path" not in _dir:
        _dir["path"] = tempfile.mkdtemp(prefix="jd-w-")  # short: a unix socket's path has ~100 bytes
        atexit.register(shutil.rmtree, _dir["path"], True)
    return _dir["path"]


def env_for_workers() -> dict[str, str]:
    """What a worker's environment needs to be asked for its collectives."""
    return {SOCKETS_VAR: sockets_dir()}


def socket_path(folder: str, pid: int) -> str:
    return os.path.join(folder, f"{pid}.sock")


def serve() -> str | None:
    """In a worker: record this process's collectives and answer for them on its socket; the socket's
    path, or None when the worker was not started by an engine (no `SOCKETS_VAR`) or cannot bind."""
    collective_record.install()
    collective_record.reset()  # on or off as the rank's JUPYTER_DIST_OBSERVE says
    folder = os.environ.get(SOCKETS_VAR)
    if not folder:
        return None
    path = socket_path(folder, os.getpid())
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        server.bind(path)
        server.listen(8)
    except OSError:
        server.close()
        return None
    atexit.register(_remove, path)
    threading.Thread(target=_serve, args=(server,), name="jupyter-dist worker collectives", daemon=True).start()
    return path


def _serve(server: socket.socket) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn, contextlib.suppress(OSError):
            conn.settimeout(2.0)
            conn.sendall(json.dumps(collective_record.snapshot()).encode() + b"\n")


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def ask_one(pid: int, folder: str | None = None, timeout: float = ASK_S) -> dict[str, Any]:
    """Worker `pid`'s record ({"in_flight", "done", "now"}), or {"error": why} when it did not answer."""
    path = socket_path(folder or sockets_dir(), pid)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(path)
            data = read_line(conn, MAX_ANSWER)
        answer = json.loads(data)
        if not isinstance(answer, dict):
            raise ValueError("not a record")
        return answer
    except FileNotFoundError:
        return {"error": "its worker keeps no record (not started through this engine, or not yet)"}
    except (OSError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


def ask(found: list[tuple[int | None, int]], folder: str | None = None,
        timeout: float = ASK_S) -> list[dict[str, Any]]:
    """Each worker's record, asked at once: [{"rank" (None: the engine's own), "pid", ...record}]."""
    folder = folder or sockets_dir()
    answers: dict[int, dict[str, Any]] = {}

    def one(pid: int) -> None:
        answers[pid] = ask_one(pid, folder, timeout)

    threads = [threading.Thread(target=one, args=(pid,), daemon=True) for _, pid in found]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 0.5)
    return [{"rank": rank, "pid": pid, **answers.get(pid, {"error": "no answer in time"})} for rank, pid in found]
