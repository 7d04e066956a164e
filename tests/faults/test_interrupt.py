"""A kernel interrupt reaches every rank by its own path; the cell ends promptly; the next cell runs."""

from __future__ import annotations

import os
import time

import pytest
from jupyter_client.manager import start_new_kernel

pytestmark = [pytest.mark.engines, pytest.mark.timeout(240)]


def execute(kc, code: str, timeout: float = 120) -> tuple[str, dict | None]:
    msg_id = kc.execute(code)
    out, error = [], None
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            error = msg["content"]
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return "".join(out), error


def test_interrupt_reaches_every_rank():
    km, kc = start_new_kernel(kernel_name="python3", env={**os.environ})
    try:
        execute(kc, "%load_ext jupyter_dist")
        _, err = execute(kc, "%%distrun -f mpi -N 2 -n 2\nx = 1")
        assert err is None
        msg_id = kc.execute(
            "%%distrun -N 2 -n 2\nimport time\ntry:\n    time.sleep(120)\n"
            "except KeyboardInterrupt:\n    print('interrupted', flush=True)\n    raise\n"
        )
        time.sleep(4)
        t0 = time.monotonic()
        km.interrupt_kernel()
        error, out = None, []
        while True:
            msg = kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            if msg["msg_type"] == "error":
                error = msg["content"]
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        elapsed = time.monotonic() - t0
        assert error is not None and error["ename"] == "KeyboardInterrupt"
        text = "".join(out)
        for r in range(4):
            assert f"[rank {r}|node {r // 2}] interrupted" in text  # every rank got it
        assert elapsed < 30  # promptly, not after the ranks' 120 s sleep
        out, err = execute(kc, "%%distrun -N 2 -n 2 -o y\ny = x + 1")
        assert err is None
        out, _ = execute(kc, "print(y)")
        assert "[2, 2, 2, 2]" in out
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
