"""One rank's engine replaced, the others kept warm: deaths, a rank stuck in native code, by hand, mpi4py.

Real engines under Open MPI (`--enable-recovery`), real gloo groups. Times are printed and recorded for
docs/reliability.md, never asserted. This module runs with the users' default of one warm spare engine
(`DistSettings.spare_engines`; the rest of the suite runs without, see tests/conftest.py), and one test
without it (the replacement started at the death).
"""

from __future__ import annotations

import os
import time

import pytest

import jupyter_dist
from jupyter_dist.cluster import replacement
from jupyter_dist.errors import RankFailure, RunTimeout
from jupyter_dist.plan.defaults import STORE
from jupyter_dist.plan.settings import settings

from .test_faults import record

pytestmark = [pytest.mark.engines, pytest.mark.timeout(240)]

LAYOUT = "-N 2 -n 2"
GROUP = ("import os, time, signal, ctypes, torch, torch.distributed as dist\n"
         "dist.init_process_group('gloo', init_method='env://')\n"
         "rank = dist.get_rank()\n")


@pytest.fixture(scope="module", autouse=True)
def one_spare():
    was = settings().spare_engines
    settings().spare_engines = 1  # the users' default
    yield
    settings().spare_engines = was


def cluster():
    return jupyter_dist.get_session().cluster


def spare_ready(timeout: float = 120.0) -> float:
    """Wait until the warm spare has registered and finished its start (the imports a rank had), as it
    has in a notebook used for a while; returns how long that took."""
    t0 = time.monotonic()
    c = cluster()
    while True:
        spare = replacement.spare_ids(c)
        if spare:
            c.client[spare].apply_sync(os.getpid)  # served once its startup imports are done
            return time.monotonic() - t0
        assert time.monotonic() - t0 < timeout, "no spare engine registered"
        time.sleep(0.2)


def pids() -> list[int]:
    return [e.pid for e in cluster().engines]


def warm_up(shell) -> None:
    """Every rank holds `kept` (its rank), as a loaded model would be held."""
    shell.run_cell_magic("distrun", LAYOUT, GROUP + "kept = rank\n")


def next_cell(distrun, shell) -> tuple[float, str]:
    """The next cell on the same world: a fresh group over all ranks, and what each rank kept."""
    t0 = time.monotonic()
    out = distrun(f"{LAYOUT} -o ok", GROUP + "t = torch.ones(1); dist.all_reduce(t)\n"
                  "ok = (t.item(), globals().get('kept'))\n")
    return time.monotonic() - t0, out.out


@pytest.mark.parametrize(
    "kill",
    ["os._exit(3)", "os.kill(os.getpid(), signal.SIGKILL)", "ctypes.string_at(0)"],
    ids=["exit3", "sigkill", "segfault"],
)
def test_dead_rank_replaced_others_keep_their_variables(distrun, shell, kill, request, capsys):
    how = request.node.callspec.id
    warm_up(shell)
    waited = spare_ready()
    assert cluster().status()["spares"] == 1
    before = pids()
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        shell.run_cell_magic("distrun", LAYOUT, GROUP + f"if rank == 2:\n    {kill}\ntime.sleep(30)\n")
    reported = time.monotonic() - t0
    capsys.readouterr()
    assert "rank 2 died" in str(info.value)
    took, out = next_cell(distrun, shell)
    assert "rank 2 was replaced by a new engine" in out and "its variables are gone" in out
    assert shell.user_ns["ok"] == [(4.0, 0), (4.0, 1), (4.0, None), (4.0, 3)]
    now = pids()
    assert [now[r] for r in (0, 1, 3)] == [before[r] for r in (0, 1, 3)] and now[2] != before[2]
    print(f"\n{how}: reported after {reported:.2f} s; next cell (the warm spare given rank 2) {took:.2f} s "
          f"(the spare was ready {waited:.1f} s after the warm-up cell)\n{out}")
    record(f"time_to_report_dead_rank_{how}_s", round(reported, 2))
    record(f"time_to_next_cell_after_{how}_replaced_s", round(took, 2))


def test_next_cell_after_reading_the_error(distrun, shell, capsys, monkeypatch):
    """With no warm spare, the replacement starts at the death: a user who reads the error for a while
    waits less."""
    monkeypatch.setattr(settings(), "spare_engines", 0)
    shell.run_line_magic("dist", "restart")  # no spare left from the tests before
    warm_up(shell)
    assert cluster().status()["spares"] == 0
    with pytest.raises(RankFailure):
        shell.run_cell_magic("distrun", LAYOUT, GROUP + "if rank == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\n"
                             "time.sleep(30)\n")
    capsys.readouterr()
    time.sleep(15)  # reading the error
    took, out = next_cell(distrun, shell)
    assert "rank 1 was replaced" in out
    assert shell.user_ns["ok"] == [(4.0, 0), (4.0, None), (4.0, 2), (4.0, 3)]
    assert cluster().status()["spares"] == 0
    print(f"\nsigkill, no spare, next cell 15 s after the error: {took:.2f} s\n{out}")
    record("time_to_next_cell_15s_after_sigkill_s", round(took, 2))


def test_rank_stuck_in_native_code_is_reported_and_replaced(distrun, shell, capsys):
    """The GIL held in C (a builtin's loop): no agent, no signal handler runs; py-spy reads its stack."""
    warm_up(shell)
    before = pids()
    t0 = time.monotonic()
    with pytest.raises(RunTimeout) as info:
        shell.run_cell_magic("distrun", f"{LAYOUT} --timeout 5",
                             GROUP + "if rank == 2:\n    sum(range(10**14))\ndist.barrier()\n")
    reported = time.monotonic() - t0
    STORE.update(timeout=None)
    capsys.readouterr()
    text = "\n".join(info.value._render_traceback_())
    assert "rank 2: its Python did not answer" in text and "native stack (py-spy)" in text, text
    assert "rank(s) 2 did not stop" in text, text
    took, out = next_cell(distrun, shell)
    assert "rank 2 was replaced" in out
    assert shell.user_ns["ok"] == [(4.0, 0), (4.0, 1), (4.0, None), (4.0, 3)]
    assert [pids()[r] for r in (0, 1, 3)] == [before[r] for r in (0, 1, 3)]
    print(f"\nnative hang: --timeout 5: reported after {reported:.2f} s; next cell {took:.2f} s\n{text}")
    record("hang_native_gil_timeout_5_report_s", round(reported, 2))
    record("hang_native_gil_next_cell_s", round(took, 2))


def test_restart_one_rank_by_hand(distrun, shell, capsys):
    warm_up(shell)
    waited = spare_ready()
    before = pids()
    t0 = time.monotonic()
    shell.run_line_magic("dist", "restart --rank 1")
    took = time.monotonic() - t0
    out = capsys.readouterr().out
    assert "rank 1 was replaced by a new engine" in out
    now = pids()
    assert now[1] != before[1] and [now[r] for r in (0, 2, 3)] == [before[r] for r in (0, 2, 3)]
    _, _ = next_cell(distrun, shell)
    assert shell.user_ns["ok"] == [(4.0, 0), (4.0, None), (4.0, 2), (4.0, 3)]
    print(f"\n%dist restart --rank 1 (a warm spare ready after {waited:.1f} s): {took:.2f} s")
    record("time_to_restart_one_rank_by_hand_s", round(took, 2))


def test_dead_spare_is_not_given_a_rank(distrun, shell, capsys, monkeypatch):
    """The warm spare's process killed, then a rank: the dead spare is noticed (gone from the controller,
    or its process ended) and a new engine is started for the rank, not waited for until start_timeout."""
    monkeypatch.setattr(settings(), "start_timeout", 60.0)  # were the dead spare waited for: a failure in 60 s
    warm_up(shell)
    spare_ready()
    warm_up(shell)  # after a run the spares are seen and asked their pids (replacement.tend)
    c = cluster()
    (spare,) = replacement.spare_ids(c)
    spare_pid = c.client[spare].apply_sync(os.getpid)
    os.kill(spare_pid, 9)
    t0 = time.monotonic()
    while spare in c.client.ids and time.monotonic() - t0 < 20:  # the controller drops it (here: at once)
        time.sleep(0.1)
    before = pids()
    t1 = time.monotonic()
    shell.run_line_magic("dist", "restart --rank 1")
    took = time.monotonic() - t1
    assert "rank 1 was replaced by a new engine" in capsys.readouterr().out
    _, out = next_cell(distrun, shell)
    assert shell.user_ns["ok"] == [(4.0, 0), (4.0, None), (4.0, 2), (4.0, 3)]
    now = pids()
    assert [now[r] for r in (0, 2, 3)] == [before[r] for r in (0, 2, 3)] and now[1] not in (before[1], spare_pid)
    print(f"\nthe warm spare killed (unregistered after {t1 - t0:.1f} s), then %dist restart --rank 1: {took:.2f} s "
          "(a new engine started for it)")
    record("time_to_restart_one_rank_dead_spare_s", round(took, 2))


def test_mpi4py_after_a_replacement(distrun, shell):
    """A replacement has an MPI world of its own; -f mpi then restarts the cluster into one world."""
    if not cluster().mpi_world_split:
        shell.run_line_magic("dist", "restart --rank 3")
    distrun(f"{LAYOUT} -o size", "from mpi4py import MPI\nsize = MPI.COMM_WORLD.Get_size()\n")
    sizes = shell.user_ns["size"]
    assert sizes.count(1) >= 1 and sizes.count(4) >= 1, sizes  # the survivors' world, the replacements' own
    out = distrun(f"-f mpi {LAYOUT} -o size", "from mpi4py import MPI\nsize = MPI.COMM_WORLD.allreduce(1)\n")
    assert "needs one MPI world" in out.out
    assert shell.user_ns["size"] == [4] * 4
    assert not cluster().mpi_world_split
