"""A cell sent to many engines with one hand-off to the client's I/O thread.

`DirectView.execute` (what `%%px` calls) builds one request per engine and hands each to the
client's I/O thread on its own (`Client._send`: an `add_callback` per engine, each a write to the
loop's wake-up pipe and, with the GIL, a switch between the notebook's main thread and that
thread): at 32 ranks 32 wake-ups for one cell. `execute_all` builds the same requests, with the
same futures and bookkeeping, and hands them over in one callback that sends them all: the ranks
get the same messages, the kernel wakes its I/O thread once.

It uses the client's internals as ipyparallel 8.6-9.x lay them out (`_build_targets`,
`create_message_futures`, `_outstanding_dict`, `_io_loop`); a client without them is sent the
cell through `DirectView.execute`, as before.
"""

from __future__ import annotations

from typing import Any

_NEEDS = ("_build_targets", "create_message_futures", "_outstanding_dict", "_io_loop", "session",
          "outstanding", "history", "_futures", "_output_futures", "results", "metadata")


def batched(client: Any, view: Any) -> bool:
    """Whether `execute_all` can send through `client`'s internals (else it falls back to `view`)."""
    return all(hasattr(client, name) for name in _NEEDS) and getattr(view, "_socket", None) is not None


def execute_all(client: Any, view: Any, code: str, *, silent: bool = True, label: str | None = None) -> Any:
    """`view.execute(code, silent=silent, block=False, label=label)`, the requests handed to the
    I/O thread at once. Returns the same `AsyncResult` (one child per target, in `view.targets` order)."""
    if not batched(client, view) or getattr(client, "_closed", False):
        return view.execute(code, silent=silent, block=False, label=label)
    from ipyparallel.client.asyncresult import AsyncResult  # heavy: ipyparallel is loaded by now anyway
    from ipyparallel.client.futures import multi_future  # heavy: as above

    idents, targets = client._build_targets(view.targets)
    metadata = {"label": label}
    content = {"code": code, "silent": bool(silent), "user_expressions": {}}
    sends: list[tuple[bytes, dict[str, Any]]] = []
    futures = []
    for ident in idents:
        msg = client.session.msg("execute_request", content=content, metadata=metadata)
        msg_id = msg["header"]["msg_id"]
        client.outstanding.add(msg_id)
        client.history.append(msg_id)
        name = ident.decode("utf-8")
        if name in client._engines.values():  # kept in case the engine dies (as Client._send does)
            client._outstanding_dict[name].add(msg_id)
        pair = client.create_message_futures(msg_id, msg["header"], async_result=True, track=False, label=label)
        multi_future(pair).add_done_callback(_cleanup(client, msg_id))
        futures.append(pair[0])
        sends.append((ident, msg))
    socket = view._socket

    def send_all() -> None:
        for ident, msg in sends:
            client.session.send(socket, msg, ident=ident)

    client._io_loop.add_callback(send_all)
    return AsyncResult(client, futures, fname="execute", targets=targets, owner=True)


def _cleanup(client: Any, msg_id: str) -> Any:
    """The client's caches of one request purged once it resolved (as `Client._send` does)."""

    def purge(_future: Any) -> None:
        client.results.pop(msg_id, None)
        client._futures.pop(msg_id, None)
        client._output_futures.pop(msg_id, None)
        client.metadata.pop(msg_id, None)

    return purge
