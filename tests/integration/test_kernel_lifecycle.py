"""A real kernel: its shutdown (clean or killed) leaves no controller, mpiexec or engine behind."""

from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest
from jupyter_client.manager import start_new_kernel
from kernel import execute

pytestmark = [pytest.mark.engines, pytest.mark.timeout(240)]

PIDS_CELL = (
    "import json, jupyter_dist\n"
    "c = jupyter_dist.get_session().cluster\n"
    "print('PIDS', json.dumps(sorted(set(c._cluster_pids() + [e.pid for e in c.engines]))))"
)


def run(kc, code: str, timeout: float = 120) -> str:
    return execute(kc, code, timeout).raise_error().stdout


def cluster_pids(kc) -> list[int]:
    out = run(kc, PIDS_CELL)
    line = next(line for line in out.splitlines() if line.startswith("PIDS"))
    return json.loads(line.split(" ", 1)[1])


def all_gone(pids: list[int], within: float) -> list[int]:
    end = time.monotonic() + within
    while time.monotonic() < end:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.5)
    return alive


def start_cluster_in_kernel():
    km, kc = start_new_kernel(kernel_name="python3", env={**os.environ})
    run(kc, "%load_ext jupyter_dist")
    out = run(kc, "%%distrun -f mpi -N 1 -n 2\nfrom mpi4py import MPI\nprint('size', MPI.COMM_WORLD.size)")
    assert "[rank 1] size 2" in out
    pids = cluster_pids(kc)
    assert len(pids) >= 4  # controller, mpiexec, two engines
    return km, kc, pids


def test_clean_shutdown_leaves_nothing():
    km, kc, pids = start_cluster_in_kernel()
    kc.stop_channels()
    km.shutdown_kernel(now=False)
    assert all_gone(pids, 30) == []


def test_killed_kernel_leaves_nothing():
    km, kc, pids = start_cluster_in_kernel()
    kc.stop_channels()
    os.kill(km.provisioner.process.pid, signal.SIGKILL)
    assert all_gone(pids, 30) == []
    km.cleanup_resources()
