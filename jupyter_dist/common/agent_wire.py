"""The wire format between the notebook and a rank's agent (engine/agent.py): one JSON line each way.

Request: {"token": str, "op": str, "args": {...}}; reply: {"ok": true, "result": ...} or
{"ok": false, "error": str}.
"""

from __future__ import annotations

import json
import socket
from typing import Any, TypedDict

MAX_REQUEST = 1 << 20  # bytes: a request is small (an op and its arguments)


class Request(TypedDict):
    token: str
    op: str
    args: dict[str, Any]


def encode_request(token: str, op: str, args: dict[str, Any] | None = None) -> bytes:
    return json.dumps({"token": token, "op": op, "args": args or {}}).encode() + b"\n"


def decode_request(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_REQUEST:
        raise ValueError("request too large")
    try:
        request = json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("not a JSON request") from None
    if not isinstance(request, dict):
        raise ValueError("not a JSON object")
    return request


def encode_reply(reply: dict[str, Any]) -> bytes:
    return json.dumps(reply).encode() + b"\n"


def decode_reply(data: bytes) -> dict[str, Any]:
    reply = json.loads(data.decode())
    if not isinstance(reply, dict) or "ok" not in reply:
        raise ValueError("not an agent reply")
    return reply


def read_line(conn: socket.socket, limit: int | None = None) -> bytes:
    """Bytes up to and including the first newline (or until the peer closes, or past `limit` bytes)."""
    data = b""
    while not data.endswith(b"\n") and (limit is None or len(data) <= limit):
        chunk = conn.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    return data
