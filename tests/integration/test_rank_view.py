"""See every rank while it runs, on real engines, real Open MPI and real gloo: stacks on demand, the
collective each rank is in, a straggler, and each rank's CPU and memory. One 2x2 cluster for the module.
Times are printed, never asserted."""

from __future__ import annotations

import threading
import time

import pytest
from IPython.utils.capture import capture_output

import jupyter_dist
from jupyter_dist.errors import RunTimeout
from jupyter_dist.plan.defaults import STORE
from jupyter_dist.run.rank_report import take
from jupyter_dist.views.resources_view import resources_svg

pytestmark = [pytest.mark.engines, pytest.mark.timeout(300)]

LAYOUT = "-f pytorch -N 2 -n 2"
GROUP = "import torch, torch.distributed as dist\ndist.init_process_group('gloo', init_method='env://')\n"


def session():
    return jupyter_dist.get_session()


def report_when(ready, within: float = 30.0):
    """The first report of every rank's stacks and collectives for which `ready(report)` holds."""
    deadline = time.monotonic() + within
    report = None
    while time.monotonic() < deadline:
        report = take(session().cluster.agents, timeout=2.0)
        if report.stacks and ready(report):
            session().reports.keep(report)
            return report
        time.sleep(0.3)
    return report


def seqs(report) -> dict[int, int | None]:
    """Each rank's collective in flight by its number (None: none), from a report."""
    return {r: (c["in_flight"][0]["seq"] if c["in_flight"] else None) for r, c in report.collectives.items()}


def say(capsys, text: str) -> None:
    """A measured figure, printed past the capture of the run's output."""
    with capsys.disabled():
        print(f"\n{text}", flush=True)


def in_background(fn):
    got = {}
    thread = threading.Thread(target=lambda: got.setdefault("value", fn()), daemon=True)
    thread.start()
    return thread, got


def test_stacks_while_a_cell_runs_and_the_last_ones_after(distrun, shell, capsys):
    distrun(LAYOUT, "x = 1")  # the cluster up
    control = session().control()

    def ask():
        time.sleep(1.5)
        t0 = time.monotonic()
        text = control.stacks()  # what the sidebar's Stacks button and %dist stacks show
        return text, time.monotonic() - t0

    thread, got = in_background(ask)
    distrun(LAYOUT, "import time\ndef waiting():\n    time.sleep(5)\nwaiting()")
    thread.join()
    text, took = got["value"]
    say(capsys, f"stacks of 4 ranks while the cell ran: {took * 1000:.0f} ms\n{text}")
    assert "ranks 0-3: time.sleep at <cell>:3" in text
    assert "<cell>:4 in <module>: waiting()" in text
    shell.run_line_magic("dist", "stacks")  # after the run: the ranks are idle, the last stacks stay
    after = capsys.readouterr().out
    assert "the last stacks taken while the ranks ran" in after
    assert "ranks 0-3: time.sleep at <cell>:3" in after


def test_a_rank_that_never_reached_the_collective_is_the_straggler(distrun, shell, capsys):
    cell = GROUP + ("import time\nt = torch.ones(4)\ndist.all_reduce(t)\n"
                    "if dist.get_rank() == 3:\n    time.sleep(8)\ndist.all_reduce(t)\n")
    thread, got = in_background(lambda: report_when(lambda r: seqs(r) == {0: 2, 1: 2, 2: 2, 3: None}))
    distrun(LAYOUT, cell)  # rank 3 joins late: the run ends well
    thread.join()
    lines = got["value"].collective_lines()
    say(capsys, "\n".join(lines))
    assert lines[0] == "ranks 0,1,2 are in all_reduce #2 (4 floats)"
    assert lines[1] == ("rank 3 never reached all_reduce #2 (its last: all_reduce #1 (4 floats)); "
                        "it is at time.sleep at <cell>:7: the straggler")


def test_resources_of_every_rank_and_the_one_that_allocates_more(distrun, shell, capsys):
    cell = ("import os, time\nblob = b'x' * ((600 if os.environ['RANK'] == '2' else 1) << 20)\n"
            "t = time.time()\nwhile time.time() - t < 7:\n    sum(range(20000))\n    time.sleep(0.01)\ndel blob\n")
    with capture_output() as cap:
        shell.run_cell_magic("distrun", LAYOUT, cell)
    # the chart at the end: an image alone (no text a notebook comparison would read)
    assert [sorted(o.data) for o in cap.outputs if "image/png" in o.data] == [["image/png"]]
    store = session().resources
    peaks = store.peak_rss()
    say(capsys, "\n".join(["peak resident memory by rank (MiB):", *(f"  rank {r}: {v >> 20}" for r, v in sorted(peaks.items())),
                     *store.summary_lines()]))
    assert sorted(peaks) == [0, 1, 2, 3]
    assert all(len(s) >= 2 for s in store.copy().values())
    assert all(peaks[2] > peaks[r] + (400 << 20) for r in (0, 1, 3))
    svg = resources_svg(store)  # the live view's drawing (the end's PNG: tests/unit/test_rank_resources.py)
    assert svg and all(f"rank {r}" in svg for r in range(4))


def test_a_mismatched_collective_is_named_with_its_ranks_and_ops(distrun, shell, capsys):
    cell = GROUP + ("t = torch.ones(4)\nfor _ in range(11):\n    dist.all_reduce(t)\n"
                    "if dist.get_rank() == 1:\n    dist.broadcast(t, 0)\nelse:\n    dist.all_reduce(t)\n")
    thread, got = in_background(lambda: report_when(lambda r: seqs(r) == dict.fromkeys(range(4), 12)))
    with pytest.raises(RunTimeout):
        shell.run_cell_magic("distrun", f"{LAYOUT} --timeout 20", cell)
    STORE.update(timeout=None)
    thread.join()
    lines = got["value"].collective_lines()
    say(capsys, "\n".join(lines))
    assert lines[0] == "rank 1 is in broadcast #12 (4 floats); ranks 0,2,3 are in all_reduce #12 (4 floats)"
    shell.run_line_magic("dist", "stacks")  # after the timeout: the last ones taken, collectives first
    assert "rank 1 is in broadcast #12 (4 floats)" in capsys.readouterr().out
