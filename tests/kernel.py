"""Driving a real Jupyter kernel as a notebook does: one helper for every test that reads iopub.

`execute(kc, code)` sends a cell and gathers its iopub messages until the kernel is idle again;
`wait_idle(kc, msg_id)` does the same for a cell already sent (say, one about to be interrupted).
(tests/ is on pytest's pythonpath; conftest.py's `kernel` fixture starts and stops the kernel.)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reply:
    """The iopub messages of one cell: its own, and comm messages (widgets) while it ran."""

    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def stdout(self) -> str:
        return "".join(m["content"]["text"] for m in self.own("stream"))

    @property
    def error(self) -> dict[str, Any] | None:
        errors = self.own("error")
        return errors[0]["content"] if errors else None

    def own(self, msg_type: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["msg_type"] == msg_type]

    def raise_error(self) -> Reply:
        """This reply, or an AssertionError carrying the cell's traceback."""
        if self.error is not None:
            raise AssertionError("\n".join(self.error["traceback"]))
        return self


def wait_idle(kc: Any, msg_id: str, timeout: float = 120, comms: bool = False) -> Reply:
    """Every iopub message of cell `msg_id` (and comm messages, with `comms`) until it is idle."""
    reply = Reply()
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        mine = msg["parent_header"].get("msg_id") == msg_id
        if mine or (comms and msg["msg_type"].startswith("comm")):
            reply.messages.append(msg)
        if mine and msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return reply


def execute(kc: Any, code: str, timeout: float = 120, comms: bool = False) -> Reply:
    return wait_idle(kc, kc.execute(code), timeout, comms)


@contextlib.contextmanager
def started_kernel(env: dict[str, str] | None = None) -> Iterator[tuple[Any, Any]]:
    """A fresh python3 kernel (manager, client) with this process's environment; shut down after."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", env={**os.environ, **(env or {})})
    try:
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
