"""A kernel interrupt reaches every rank by its own path; the cell ends promptly; the next cell runs."""

from __future__ import annotations

import time

import pytest
from kernel import execute, started_kernel, wait_idle

pytestmark = [pytest.mark.engines, pytest.mark.timeout(240)]


def test_interrupt_reaches_every_rank():
    with started_kernel() as (km, kc):
        execute(kc, "%load_ext jupyter_dist")
        assert execute(kc, "%%distrun -f mpi -N 2 -n 2\nx = 1").error is None
        msg_id = kc.execute(
            "%%distrun -N 2 -n 2\nimport time\ntry:\n    time.sleep(120)\n"
            "except KeyboardInterrupt:\n    print('interrupted', flush=True)\n    raise\n"
        )
        time.sleep(4)
        t0 = time.monotonic()
        km.interrupt_kernel()
        reply = wait_idle(kc, msg_id, timeout=60)
        elapsed = time.monotonic() - t0
        assert reply.error is not None and reply.error["ename"] == "KeyboardInterrupt"
        for r in range(4):
            assert f"[rank {r}|node {r // 2}] interrupted" in reply.stdout  # every rank got it
        assert elapsed < 30  # promptly, not after the ranks' 120 s sleep
        assert execute(kc, "%%distrun -N 2 -n 2 -o y\ny = x + 1").error is None
        assert "[2, 2, 2, 2]" in execute(kc, "print(y)").stdout
