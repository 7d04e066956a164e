"""The notebook's side of the ranks' agents (engine/agent.py): ask every rank at once, within a deadline.

The cluster starts an agent in each engine when it maps the engines to ranks and keeps their
addresses here. A request never queues behind the running cell: the agent is a thread of its own.
A rank that does not answer in time (its main thread holding the GIL in native code, or its process
gone) is left out of the answer, and `missing` says which.
"""

from __future__ import annotations

import errno
import os
import secrets
import selectors
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from jupyter_dist.common.agent_wire import decode_reply, encode_request


@dataclass(frozen=True)
class AgentAddress:
    host: str
    port: int


@dataclass
class Answers:
    """What the ranks answered (rank -> result), and which did not (rank -> why)."""

    results: dict[int, Any] = field(default_factory=dict)
    missing: dict[int, str] = field(default_factory=dict)


@dataclass
class RankAgents:
    """The ranks' agents of one cluster: their addresses by rank, and the token they take."""

    token: str = field(default_factory=lambda: secrets.token_hex(16))
    addresses: dict[int, AgentAddress] = field(default_factory=dict)

    def ask(self, op: str, ranks: Iterable[int] | None = None, args: dict[str, Any] | None = None,
            timeout: float = 1.0) -> Answers:
        """`op` on each of `ranks` (all by default) at once; waits at most `timeout` seconds.

        One thread and one selector for all the ranks' connections: a thread per rank (32 started every
        second by the resources poll at 32 ranks) took the GIL from the notebook's other threads, and
        each start waited for it, during a burst of output 0.1-0.4 s."""
        wanted = sorted(self.addresses if ranks is None else ranks)
        answers = Answers()
        payload = encode_request(self.token, op, args)
        pending: dict[int, _Exchange] = {}
        for rank in wanted:
            address = self.addresses.get(rank)
            if address is None:
                answers.missing[rank] = "no agent for this rank"
                continue
            exchange = _Exchange.start(address, payload)
            if exchange.outcome is not None:
                _record(answers, rank, exchange.outcome)
            else:
                pending[rank] = exchange
        _exchange_all(pending, time.monotonic() + timeout)
        for rank, exchange in pending.items():
            if exchange.outcome is None:
                answers.missing[rank] = "no answer in time"
            else:
                _record(answers, rank, exchange.outcome)
        return answers


def _record(answers: Answers, rank: int, outcome: tuple[bool, Any]) -> None:
    if outcome[0]:
        answers.results[rank] = outcome[1]
    else:
        answers.missing[rank] = str(outcome[1])


def _failure(e: Exception) -> tuple[bool, str]:
    return False, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


@dataclass
class _Exchange:
    """One request on a non-blocking connection: connect, send the payload, read one reply line."""

    conn: socket.socket | None
    payload: bytes
    received: bytes = b""
    outcome: tuple[bool, Any] | None = None

    @classmethod
    def start(cls, address: AgentAddress, payload: bytes) -> _Exchange:
        try:
            family, kind, proto, _, sockaddr = socket.getaddrinfo(address.host, address.port,
                                                                  type=socket.SOCK_STREAM)[0]
            conn = socket.socket(family, kind, proto)
        except OSError as e:
            return cls(None, payload, outcome=_failure(e))
        conn.setblocking(False)
        err = conn.connect_ex(sockaddr)
        if err not in (0, errno.EINPROGRESS):
            conn.close()
            return cls(None, payload, outcome=_failure(OSError(err, os.strerror(err))))  # e.g. refused at once
        return cls(conn, payload)

    def writable(self) -> None:
        """Connected (or refused); sends what is left of the payload."""
        assert self.conn is not None
        err = self.conn.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self.finish(_failure(OSError(err, os.strerror(err))))
            return
        try:
            sent = self.conn.send(self.payload)
        except BlockingIOError:
            return
        except OSError as e:
            self.finish(_failure(e))
            return
        self.payload = self.payload[sent:]

    def readable(self) -> None:
        """Reads the reply; on its newline (or the agent's close) decodes it."""
        assert self.conn is not None
        try:
            chunk = self.conn.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError as e:
            self.finish(_failure(e))
            return
        self.received += chunk
        if chunk and not chunk.endswith(b"\n"):
            return
        try:
            reply = decode_reply(self.received)
        except ValueError as e:
            self.finish(_failure(e))
            return
        self.finish((True, reply.get("result")) if reply.get("ok") else (False, reply.get("error", "refused")))

    def finish(self, outcome: tuple[bool, Any]) -> None:
        self.outcome = outcome

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _exchange_all(pending: dict[int, _Exchange], deadline: float) -> None:
    """Drive every exchange until each has its outcome or the deadline passes (the rest are closed)."""
    with selectors.DefaultSelector() as sel:
        for exchange in pending.values():
            assert exchange.conn is not None
            sel.register(exchange.conn, selectors.EVENT_WRITE, exchange)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in sel.select(left):
                exchange = key.data
                conn = exchange.conn
                if exchange.payload:
                    exchange.writable()
                else:
                    exchange.readable()
                if exchange.outcome is not None:
                    sel.unregister(conn)
                    exchange.close()
                elif not exchange.payload and key.events != selectors.EVENT_READ:
                    sel.modify(conn, selectors.EVENT_READ, exchange)
    for exchange in pending.values():
        exchange.close()
