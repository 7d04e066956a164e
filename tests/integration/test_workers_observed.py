"""The workers of -f torchrun and of --fresh observed as their ranks, on real engines (one 1x2 cluster for
the module): `%dist stacks`' report and a --timeout report show the worker's stack (py-spy, from
outside), not the engine waiting on its pipes; each rank's resources are its worker's (a worker that
holds 400 MiB more shows it); their collectives are the ranks' too (a mismatch named on --timeout, on
an interrupt; a straggler on demand). Times are printed, never asserted."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import jupyter_dist
from jupyter_dist.errors import RunTimeout
from jupyter_dist.plan.defaults import STORE
from jupyter_dist.run.rank_report import take

pytestmark = [pytest.mark.engines, pytest.mark.timeout(300)]

BUSY = ("import os, time\nblob = b'x' * ((400 if os.environ['RANK'] == '1' else 1) << 20)\n"
        "def working():\n    t = time.time()\n    while time.time() - t < 8:\n        sum(range(20000))\n"
        "        time.sleep(0.01)\nworking()\n")


def session():
    return jupyter_dist.get_session()


def stacks_while(run, ready) -> tuple[object, float]:
    """Run `run()` while taking the ranks' stacks until `ready(report)`; that report and when it came."""
    got: dict[str, object] = {}
    t0 = time.monotonic()

    def ask() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "report" not in got:
            try:  # the cluster may be starting or changing its agents: a failed look is tried again
                agents = session().cluster.agents if session().cluster is not None else None
                if agents is not None and agents.addresses:
                    report = take(agents, timeout=2.0)
                    if report.stacks and ready(report):
                        got["report"], got["at"] = report, time.monotonic() - t0
                        return
            except Exception as e:
                got["error"] = repr(e)
            time.sleep(0.3)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    run()
    asker.join(5)
    return got.get("report"), float(got.get("at", 0.0))  # type: ignore[arg-type]


def in_working(report) -> bool:
    return [g.ranks for g in report_groups(report) if g.where.startswith("time.sleep at ") and
            "working" in [f[2] for f in g.frames]] == [(0, 1)]


def report_groups(report):
    from jupyter_dist.run.stacks import group

    return group(report.stacks)


def engine_pids() -> set[int]:
    return {e.pid for e in session().cluster.engines if e is not None}


def check_resources(capsys, label: str) -> None:
    samples = session().resources.copy()
    # the workers' samples only: once a worker has ended, its engine (torch imported, ~260 MiB) is sampled
    peaks = {r: max((s["rss"] for s in got if s.get("pid")), default=0) for r, got in samples.items()}
    with capsys.disabled():
        print(f"\n{label}: peak resident memory of each rank's worker (MiB): "
              f"{({r: v >> 20 for r, v in sorted(peaks.items())})}")
    pids = {r: {s.get("pid") for s in got if s.get("pid")} for r, got in samples.items()}
    assert set(pids) == {0, 1} and all(pids.values()), pids  # samples of each rank's worker
    assert not (pids[0] | pids[1]) & engine_pids() and not pids[0] & pids[1]
    assert peaks[1] > peaks[0] + (300 << 20)


def test_torchrun_workers_stacks_and_resources_are_their_ranks(distrun, shell, capsys):
    report, at = stacks_while(lambda: distrun("-f torchrun -N 1 -n 2 --timeout 120", BUSY), in_working)
    assert report is not None, "no report showed both workers in working()"
    with capsys.disabled():
        print(f"\ntorchrun: both workers seen in working() {at:.1f} s after the start "
              f"(asked in {report.took * 1000:.0f} ms):\n{report.text()}")
    assert "<cell>:" in report.headline()  # the cell's script, named as the cell
    check_resources(capsys, "-f torchrun")


def test_fresh_child_stack_and_resources_are_the_rank(distrun, shell, capsys, tmp_path):
    script = tmp_path / "busy.py"
    script.write_text(BUSY)
    report, at = stacks_while(lambda: distrun(f"-f pytorch -N 1 -n 2 --fresh {script}"), in_working)
    assert report is not None, "no report showed both children in working()"
    assert "busy.py:" in report.headline() and "select" not in report.headline()
    check_resources(capsys, "--fresh")


def test_a_timeout_report_shows_the_torchrun_workers_stacks(shell, capsys):
    cell = "import time\ndef stuck():\n    time.sleep(600)\nstuck()\n"
    with pytest.raises(RunTimeout) as err:
        shell.run_cell_magic("distrun", "-f torchrun -N 1 -n 2 --timeout 8", cell)
    STORE.update(timeout=None)
    text = str(err.value) + "\n" + "\n".join(err.value.report)
    with capsys.disabled():
        print(f"\n{text}")
    assert "ranks 0,1: time.sleep at <cell>:3" in text


# the collectives of the workers (engine/worker_collectives.py): rank 1 in broadcast #3, rank 0 in
# all_reduce #3 (gloo); a straggler that never reaches all_reduce #2
GROUP = "import os, time, torch, torch.distributed as dist\ndist.init_process_group('gloo')\nt = torch.ones(4)\n"
MISMATCH = GROUP + ("for _ in range(2):\n    dist.all_reduce(t)\n"
                    "if dist.get_rank() == 1:\n    dist.broadcast(t, 0)\nelse:\n    dist.all_reduce(t)\n")
STRAGGLER = GROUP + ("dist.all_reduce(t)\nif dist.get_rank() == 1:\n    time.sleep(8)\ndist.all_reduce(t)\n"
                     "dist.destroy_process_group()\n")
MISMATCH_LINE = "rank 0 is in all_reduce #3 (4 floats); rank 1 is in broadcast #3 (4 floats)"


def timeout_text(shell, capsys, flags: str, cell: str | None) -> str:
    with pytest.raises(RunTimeout) as err:
        shell.run_cell_magic("distrun", flags, cell) if cell is not None else shell.run_line_magic("distrun", flags)
    STORE.update(timeout=None)
    text = str(err.value) + "\n" + "\n".join(err.value.report)
    with capsys.disabled():
        print(f"\n{flags}:\n{text}")
    return text


def test_a_torchrun_timeout_names_the_workers_mismatched_collectives(shell, capsys):
    assert MISMATCH_LINE in timeout_text(shell, capsys, "-f torchrun -N 1 -n 2 --timeout 15", MISMATCH)


def test_a_fresh_timeout_names_the_childrens_mismatched_collectives(shell, capsys, tmp_path):
    script = tmp_path / "mismatch.py"
    script.write_text(MISMATCH)
    assert MISMATCH_LINE in timeout_text(shell, capsys, f"-f pytorch -N 1 -n 2 --timeout 15 --fresh {script}", None)


def test_a_torchrun_worker_that_never_reached_the_collective_is_the_straggler(distrun, shell, capsys):
    def waiting(report) -> bool:
        c = report.collectives
        return bool(c.get(0, {}).get("in_flight")) and not c.get(1, {}).get("in_flight") and bool(c.get(1))

    report, at = stacks_while(lambda: distrun("-f torchrun -N 1 -n 2 --timeout 120", STRAGGLER), waiting)
    assert report is not None, "no report showed rank 0 waiting for rank 1"
    lines = report.collective_lines()
    with capsys.disabled():
        print(f"\ntorchrun straggler, {at:.1f} s after the start (asked in {report.took * 1000:.0f} ms):\n"
              + "\n".join(lines))
    assert lines[0] == "rank 0 is in all_reduce #2 (4 floats)"
    assert lines[1] == ("rank 1 never reached all_reduce #2 (its last: all_reduce #1 (4 floats)); "
                        "it is at time.sleep at <cell>:6: the straggler")


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt here, as ipykernel makes it while a cell runs: pytest keeps the
    handler it inherited, and a shell's background job (`cmd &` without job control) inherits SIG_IGN."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_an_interrupt_names_the_workers_mismatched_collectives(shell, capsys, sigint_raises):
    """The kernel interrupted (SIGINT to this process, as the kernel's interrupt is) once both torchrun
    workers stand in their collectives: the lines come before the ranks are stopped."""
    seen: dict[str, object] = {}

    def interrupt_when_stuck() -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:  # the cluster may be starting or changing its agents: a failed look is tried again
                agents = session().cluster.agents if session().cluster is not None else None
                if agents is not None and agents.addresses:
                    c = seen["collectives"] = take(agents, timeout=2.0).collectives
                    if all(c.get(r, {}).get("in_flight") for r in (0, 1)):
                        os.kill(os.getpid(), signal.SIGINT)
                        return
            except Exception as e:
                seen["error"] = repr(e)
            time.sleep(0.3)

    asker = threading.Thread(target=interrupt_when_stuck, daemon=True)
    asker.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            shell.run_cell_magic("distrun", "-f torchrun -N 1 -n 2 --timeout 120", MISMATCH)
    except RunTimeout:
        pytest.fail(f"no interrupt came within 90 s; what the asker saw last: {seen}")
    STORE.update(timeout=None)
    asker.join(5)
    out = capsys.readouterr().out
    with capsys.disabled():
        print("\n" + "\n".join(line for line in out.splitlines() if "collective" in line or "rank" in line[:8]))
    assert f"jupyter-dist: at the interrupt, the ranks' collectives:\n{MISMATCH_LINE}" in out
