"""The rank's agent: a thread in every engine that answers the notebook while the main thread is busy.

A cell blocks the engine's main thread, and ipyparallel serves requests on that thread only, so
anything the notebook must learn or do *during* a run (every rank's stack, an interrupt, a release
from a hung collective, input for `input()`) goes through this thread instead: a TCP server on the
address the engine reaches the controller from, one JSON request per connection, each carrying the
cluster's token. It runs whenever the main thread waits (a sleep, a collective, I/O); a main thread
that holds the GIL in native code does not let it run, and the notebook falls back on signals.

Other engine modules add operations with `register(op, handler)`; `handler(args) -> result` must
return JSON-serializable data and must not wait on the main thread.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import socket
import threading
from collections.abc import Callable
from typing import Any

from jupyter_dist.common.agent_wire import MAX_REQUEST, decode_request, encode_reply, read_line

Handler = Callable[[dict[str, Any]], Any]

_handlers: dict[str, Handler] = {}
_state: dict[str, Any] = {"server": None, "token": "", "thread": None}


def register(op: str, handler: Handler) -> None:
    """Serve `op` with `handler` (a later registration of the same op replaces the earlier one)."""
    _handlers[op] = handler


def start(token: str, host: str = "127.0.0.1") -> tuple[str, int]:
    """Start the agent once per engine (listening on `host`); returns where it listens.

    A second call (a new cluster token after a restart of the notebook's side) keeps the thread and
    takes the new token."""
    _state["token"] = token
    server = _state["server"]
    if server is None:
        server = socket.create_server((host, 0))
        server.settimeout(None)
        _state["server"] = server
        thread = threading.Thread(target=_serve, args=(server,), name="jupyter-dist agent", daemon=True)
        _state["thread"] = thread
        thread.start()
    addr, port = server.getsockname()[:2]
    return addr, port


def listening_port() -> int:
    """The agent's port (0 before it started): connections to it are never cut (faults.shut_peer_sockets)."""
    server = _state["server"]
    return server.getsockname()[1] if server is not None else 0


def _serve(server: socket.socket) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        # one short thread per request: a slow handler (a stack of many threads) never delays the next
        threading.Thread(target=_answer, args=(conn,), name="jupyter-dist agent request", daemon=True).start()


def _answer(conn: socket.socket) -> None:
    with conn, contextlib.suppress(OSError):
        conn.settimeout(5.0)
        data = read_line(conn, MAX_REQUEST)
        conn.sendall(encode_reply(_handle(data)))


def _handle(data: bytes) -> dict[str, Any]:
    try:
        request = decode_request(data)
    except ValueError as e:
        return {"ok": False, "error": str(e)}
    if not hmac.compare_digest(str(request.get("token", "")), _state["token"]):
        return {"ok": False, "error": "bad token"}
    handler = _handlers.get(str(request.get("op")))
    if handler is None:
        return {"ok": False, "error": f"unknown operation {request.get('op')!r}"}
    try:
        result = handler(request.get("args") or {})
        json.dumps(result)  # a handler's bug is its own error, not a broken reply
    except Exception as e:  # noqa: BLE001 - whatever a handler raises goes back as the reply
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return {"ok": True, "result": result}
