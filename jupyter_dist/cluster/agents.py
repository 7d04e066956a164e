"""The notebook's side of the ranks' agents (engine/agent.py): ask every rank at once, within a deadline.

The cluster starts an agent in each engine when it maps the engines to ranks and keeps their
addresses here. A request never queues behind the running cell: the agent is a thread of its own.
A rank that does not answer in time (its main thread holding the GIL in native code, or its process
gone) is left out of the answer, and `missing` says which.
"""

from __future__ import annotations

import secrets
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from jupyter_dist.common.agent_wire import decode_reply, encode_request, read_line


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
        """`op` on each of `ranks` (all by default) in parallel; waits at most `timeout` seconds."""
        wanted = sorted(self.addresses if ranks is None else ranks)
        answers = Answers()
        lock = threading.Lock()

        def one(rank: int) -> None:
            address = self.addresses.get(rank)
            if address is None:
                outcome: tuple[bool, Any] = (False, "no agent for this rank")
            else:
                outcome = _request(address, encode_request(self.token, op, args), timeout)
            with lock:
                if outcome[0]:
                    answers.results[rank] = outcome[1]
                else:
                    answers.missing[rank] = str(outcome[1])

        threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in wanted]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout + 0.5)
        with lock:
            for rank in wanted:
                if rank not in answers.results and rank not in answers.missing:
                    answers.missing[rank] = "no answer in time"
        return answers


def _request(address: AgentAddress, payload: bytes, timeout: float) -> tuple[bool, Any]:
    try:
        with socket.create_connection((address.host, address.port), timeout=timeout) as conn:
            conn.sendall(payload)
            data = read_line(conn)
        reply = decode_reply(data)
    except (OSError, ValueError) as e:
        return False, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    if reply.get("ok"):
        return True, reply.get("result")
    return False, reply.get("error", "refused")
