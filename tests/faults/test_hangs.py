"""Every hang shape under --timeout 5: reported with every rank's stack, the ranks kept warm.

Real engines under Open MPI, real gloo groups. Each test prints its time to report and to the next
cell (recorded for docs/reliability.md, never asserted), and checks that the ranks that stopped kept
their variables and that a fresh `init_process_group` works on every rank afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import jupyter_dist
from jupyter_dist.cluster.profile import state_dir
from jupyter_dist.errors import RunTimeout
from jupyter_dist.plan.defaults import STORE
from jupyter_dist.plan.settings import settings
from jupyter_dist.run import runner

from .test_faults import record

pytestmark = [pytest.mark.engines, pytest.mark.timeout(240)]

LAYOUT = "-N 2 -n 2"
T = 5
GROUP = ("import os, sys, time, signal, threading, torch, torch.distributed as dist\n"
         "dist.init_process_group('gloo', init_method='env://')\n"
         "rank = dist.get_rank()\n")

# name -> (cell after GROUP, the ranks still running at the deadline, a word every report shows)
SHAPES = {
    "collective_while_others_sleep": ("if rank == 0:\n    dist.barrier()\nelse:\n    time.sleep(600)\n",
                                      "0, 1, 2, 3", "barrier"),
    "all_in_a_collective": ("t = torch.zeros(1)\ndist.recv(t, src=(rank + 1) % 4)\n", "0, 1, 2, 3", "recv"),
    "different_collectives": ("t = torch.ones(1)\n"
                              "if rank == 1:\n    dist.broadcast(t, src=1)\nelse:\n    dist.all_reduce(t)\n"
                              "dist.barrier()\ntime.sleep(600)\n", "0, 1, 2, 3", "all_reduce"),
    "sigint_blocked": ("if rank == 1:\n    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
                       "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                       "time.sleep(600)\n", "0, 1, 2, 3", "sleep"),
    "lock_deadlock": ("lock = threading.Lock()\nif rank == 2:\n    lock.acquire()\n    lock.acquire()\n"
                      "else:\n    dist.barrier()\n", "0, 1, 2, 3", "acquire"),
    # input() on an engine raises StdinNotImplementedError at once; a read from a pipe nobody writes
    # to is the blocking read that a prompt waiting for input amounts to
    "blocked_on_input": ("if rank == 3:\n    input_wait()\nelse:\n    dist.barrier()\n", "0, 1, 2, 3", "input_wait"),
}


def cluster():
    return jupyter_dist.get_session().cluster


def timed_out(shell, capsys, flags: str, cell: str) -> tuple[float, RunTimeout, str]:
    """Run `cell` expecting a RunTimeout: (seconds until it came, the error, its rendered report)."""
    t0 = time.monotonic()
    with pytest.raises(RunTimeout) as info:
        shell.run_cell_magic("distrun", flags, cell)
    took = time.monotonic() - t0
    STORE.update(timeout=None)
    capsys.readouterr()
    return took, info.value, "\n".join(info.value._render_traceback_())


def every_rank_works(distrun, shell) -> float:
    """A fresh group on every rank (the hang's group was torn down); returns its time."""
    t0 = time.monotonic()
    distrun(f"{LAYOUT} -o ok", GROUP + "t = torch.ones(1); dist.all_reduce(t); ok = (t.item(), kept)")
    took = time.monotonic() - t0
    assert shell.user_ns["ok"] == [(4.0, r) for r in range(4)]
    return took


@pytest.fixture(scope="module", autouse=True)
def warm(shell):
    shell.run_cell_magic("distrun", LAYOUT, GROUP + "kept = rank\n"
                         "def input_wait():\n"
                         "    r, w = os.pipe()\n"   # a read nobody writes to: what input() does with no stdin
                         "    return os.read(r, 1)\n")
    yield


@pytest.mark.parametrize("shape", list(SHAPES))
def test_hang_shape_reported_within_t_plus_5(distrun, shell, shape, capsys):
    cell, running, word = SHAPES[shape]
    pids = [e.pid for e in cluster().engines]
    took, error, text = timed_out(shell, capsys, f"{LAYOUT} --timeout {T}", GROUP + cell)
    assert f"still running: rank(s) {running}" in str(error)
    assert word in text, text
    assert "no stack" not in text, text  # every running rank's stack is shown
    after = every_rank_works(distrun, shell)
    assert [e.pid for e in cluster().engines] == pids  # stopped, kept warm: not restarted
    phases = ", ".join(f"{k} {v:.2f} s" for k, v in jupyter_dist.get_session().runner.timeout_phases.items())
    print(f"\n{shape}: --timeout {T}: reported after {took:.2f} s (T + {took - T:.2f} s: {phases}); "
          f"next cell {after:.2f} s")
    print(text)
    record(f"hang_{shape}_timeout_{T}_report_s", round(took, 2))
    record(f"hang_{shape}_next_cell_s", round(after, 2))


def test_backend_flag_is_init_process_groups_default(distrun, shell):
    """With no backend argument torch makes an "undefined" group; --backend gloo is the default."""
    distrun(f"{LAYOUT} --backend gloo -o b", "import torch.distributed as dist\n"
            "if dist.is_initialized():\n    dist.destroy_process_group()\n"
            "dist.init_process_group(init_method='env://')\nb = dist.get_backend()\n")
    assert shell.user_ns["b"] == ["gloo"] * 4
    every_rank_works(distrun, shell)


def test_old_log_folders_pruned_never_this_kernels(distrun, shell, capsys):
    """Past keep_folders the oldest run folders go; this kernel's (the current run's too) stay."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    logs = state_dir() / "logs"
    for i in range(6):
        d = logs / f"20000101-00000{i}-{dead.pid}-{i}"
        d.mkdir(parents=True, exist_ok=True)
        os.utime(d, (1e6 + i, 1e6 + i))
    keep = settings().keep_folders
    settings().keep_folders = 2
    runner._PRUNED[0] = -1e9
    try:
        distrun(LAYOUT, "pass")
    finally:
        settings().keep_folders = keep
    names = [p.name for p in logs.iterdir()]
    assert not any(f"-{dead.pid}-" in n for n in names)  # the dead kernel's old folders are gone
    mine = [n for n in names if f"-{os.getpid()}-" in n]
    assert mine and len(mine) == len(names)  # every folder of this live kernel is kept, past the limit too
    shell.run_line_magic("dist", "logs")
    out = capsys.readouterr().out
    assert str(logs) in out and "retention: the newest 50 of each are kept" in out


def test_slow_to_stop_rank_reported_then_kept(distrun, shell, capsys):
    """A rank that takes longer to stop than the report waits (its cell cleans up for 3 s after the
    interrupt): the report names it as still stopping and does not wait for it; it stops within
    interrupt_grace, keeps its variables and its engine, and the next cell waits for it to finish."""
    pids = [e.pid for e in cluster().engines]
    cell = ("import time\ntry:\n    time.sleep(600)\nexcept KeyboardInterrupt:\n"
            "    if kept == 2:\n        time.sleep(3)\n    raise\n")
    took, error, text = timed_out(shell, capsys, f"{LAYOUT} --timeout {T}", cell)
    assert "rank(s) 2 had not stopped yet" in text, text
    after = every_rank_works(distrun, shell)
    assert [e.pid for e in cluster().engines] == pids
    print(f"\nslow to stop (3 s): --timeout {T}: reported after {took:.2f} s; next cell {after:.2f} s")
    record(f"hang_slow_stop_timeout_{T}_report_s", round(took, 2))


def test_mpi_wait_in_python_is_stopped_and_kept(distrun, shell, capsys):
    """mpi4py, waiting in Python: ranks 0, 2, 3 poll an `Ibarrier()` with `Test()` and `time.sleep`, rank 1
    sleeps. Every rank stops and keeps its variables and its engine. Their Ibarrier is still pending in
    COMM_WORLD: the next cell completes it (rank 1 joins it with an `Ibarrier()` of its own: a non-blocking
    collective matches no blocking one) before its own collective."""
    pids = [e.pid for e in cluster().engines]
    cell = ("import time\nfrom mpi4py import MPI\nw = MPI.COMM_WORLD\n"
            "if w.Get_rank() == 1:\n    time.sleep(600)\nelse:\n    req = w.Ibarrier()\n"
            "    while not req.Test():\n        time.sleep(0.01)\n")
    took, error, text = timed_out(shell, capsys, f"-f mpi {LAYOUT} --timeout {T}", cell)
    assert "every rank stopped and keeps its variables" in text, text
    t1 = time.monotonic()
    distrun(f"-f mpi {LAYOUT} --timeout 60 -o size", "from mpi4py import MPI\nw = MPI.COMM_WORLD\n"
            "if w.Get_rank() == 1:\n    w.Ibarrier().Wait()\nsize = (w.allreduce(1), kept)\n")
    STORE.update(timeout=None)
    after = time.monotonic() - t1
    assert shell.user_ns["size"] == [(4, r) for r in range(4)]
    assert [e.pid for e in cluster().engines] == pids
    print(f"\nmpi4py Ibarrier polled in Python vs sleep: --timeout {T}: reported after {took:.2f} s; "
          f"next -f mpi cell {after:.2f} s\n{text}")
    record(f"hang_mpi_ibarrier_poll_timeout_{T}_report_s", round(took, 2))


def test_mpi_collective_hang(distrun, shell, capsys):
    """mpi4py: ranks 0, 2, 3 in `COMM_WORLD.Barrier()`, rank 1 asleep, `-f mpi --timeout 5`. Reported with
    every rank's stack, without waiting out interrupt_grace; the ranks in the barrier wait in Open MPI's C
    loop, which no signal's handler can leave, so they are named as still stopping, killed when the grace
    ends, and the next `-f mpi` run (one MPI world needed) restarts the cluster, saying why. Last in the
    module: the engines' variables are gone after it."""
    cell = ("import time\nfrom mpi4py import MPI\nw = MPI.COMM_WORLD\n"
            "if w.Get_rank() == 1:\n    time.sleep(600)\nelse:\n    w.Barrier()\n")
    took, error, text = timed_out(shell, capsys, f"-f mpi {LAYOUT} --timeout {T}", cell)
    assert "still running: rank(s) 0, 1, 2, 3" in str(error)
    assert "Barrier" in text and "sleep" in text, text
    assert "rank(s) 0, 2, 3 had not stopped yet" in text, text
    t1 = time.monotonic()
    out = distrun(f"-f mpi {LAYOUT} -o size", "from mpi4py import MPI\nsize = MPI.COMM_WORLD.allreduce(1)\n")
    after = time.monotonic() - t1
    assert shell.user_ns["size"] == [4] * 4
    assert "rank(s) 0, 2, 3 did not stop after the timeout" in out.out, out.out
    phases = ", ".join(f"{k} {v:.2f} s" for k, v in jupyter_dist.get_session().runner.timeout_phases.items())
    print(f"\nmpi4py Barrier vs sleep: --timeout {T}: reported after {took:.2f} s ({phases}); "
          f"next -f mpi cell {after:.2f} s\n"
          f"{text}\n{out.out}")
    record(f"hang_mpi_barrier_timeout_{T}_report_s", round(took, 2))
    record("hang_mpi_barrier_next_cell_s", round(after, 2))
