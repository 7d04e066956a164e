"""The workers of -f torchrun and of --fresh observed as their ranks, on real engines (one 1x2 cluster for
the module): `%dist stacks`' report and a --timeout report show the worker's stack (py-spy, from
outside), not the engine waiting on its pipes; each rank's resources are its worker's (a worker that
holds 400 MiB more shows it). Times are printed, never asserted."""

from __future__ import annotations

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
            agents = session().cluster.agents if session().cluster is not None else None
            if agents is not None and agents.addresses:
                report = take(agents, timeout=2.0)
                if report.stacks and ready(report):
                    got["report"], got["at"] = report, time.monotonic() - t0
                    return
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
    store = session().resources
    peaks = store.peak_rss()
    with capsys.disabled():
        print(f"\n{label}: peak resident memory by rank (MiB): {({r: v >> 20 for r, v in sorted(peaks.items())})}")
    pids = {r: {s.get("pid") for s in got if s.get("pid")} for r, got in store.copy().items()}
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
