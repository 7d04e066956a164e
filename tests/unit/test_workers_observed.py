"""A rank's workers observed in place of its engine (--fresh's child, torchrun's workers): a real child
process found, read by py-spy and sampled; and the pure pieces (NVML's readings turned into a rank's GPU
figures, the notebook's unfolding of workers' stacks and samples by rank) on data made by hand."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from jupyter_dist.engine import resources, stacks, workers
from jupyter_dist.engine.script_fresh import CHILD
from jupyter_dist.run import resources as run_resources
from jupyter_dist.run import stacks as run_stacks

pytestmark = pytest.mark.timeout(60)
MIB = 1 << 20


@pytest.fixture
def child(tmp_path):
    """A real `python -m engine.script_child script.py` holding 200 MiB and waiting in `waiting()`."""
    script = tmp_path / "sleeper.py"
    script.write_text("import time\nblob = b'x' * (200 << 20)\ndef waiting():\n    time.sleep(60)\nprint('ready', flush=True)\nwaiting()\n")
    proc = subprocess.Popen([sys.executable, "-m", CHILD, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    workers.watch(proc.pid, CHILD)
    yield proc
    workers.forget(proc.pid)
    proc.kill()
    proc.wait()


def test_a_watched_child_is_found_and_its_stack_read_from_outside(child):
    assert workers.workers() == [(None, child.pid)]
    threads = stacks.thread_stacks()
    mine = [t for t in threads if t.get("worker") == child.pid]
    assert mine and mine[0]["main"] and threads[0] is mine[0]  # the worker's main thread first
    assert [f[2] for f in mine[0]["frames"]][-2:] == ["<module>", "waiting"]
    assert mine[0]["frames"][-1][3] == "time.sleep(60)"  # the source line, as the agent's own frames have it
    assert run_stacks.group(run_stacks.by_rank({3: threads}))[0].where.endswith("/sleeper.py:4")


def test_a_watched_child_is_sampled_as_the_rank(child):
    import psutil

    sample = resources._sample(psutil.Process(), psutil, resources._Gpus())
    (w,) = sample["workers"]
    assert (w["rank"], w["pid"]) == (None, child.pid) and w["rss"] > 200 * MIB
    got = run_resources.by_rank({3: {"samples": [sample]}})
    assert got[3][0]["rss"] == w["rss"] and got[3][0]["pid"] == child.pid


def test_workers_are_the_processes_that_run_the_module_first():
    assert workers.runs_module(["/py", "-u", "-m", "pkg.agent", "s.py"], "pkg.agent")
    # torchrun's own command line names the worker module after its own -m
    assert not workers.runs_module(["/py", "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "pkg.agent"],
                                   "pkg.agent")
    assert not workers.runs_module(["/py", "script.py"], "pkg.agent")


def test_nvml_readings_become_a_rank_gpu_figures():
    """The GPU path without a GPU: what `_Gpus.read` makes of NVML, in; the rank's figures, out."""
    devices = [
        {"index": 0, "util": 93, "mem_used": 30 << 30, "mem_total": 80 << 30, "procs": [(101, 12 << 30), (102, 2 << 30)]},
        {"index": 1, "util": 40, "mem_used": 9 << 30, "mem_total": 80 << 30, "procs": [(201, 8 << 30)]},
        {"index": 2, "util": 0, "mem_used": 1 << 30, "mem_total": 80 << 30, "procs": [(101, None)]},  # not visible
    ]
    assert resources.gpu_figures(devices, {101, 102}) == [
        {"index": 0, "util": 93, "mem": 14 << 30, "mem_used": 30 << 30, "mem_total": 80 << 30},
        {"index": 2, "util": 0, "mem": 0, "mem_used": 1 << 30, "mem_total": 80 << 30}]
    assert resources.gpu_figures(devices, {201})[0]["mem"] == 8 << 30
    assert resources.gpu_figures(devices, {999}) == []
    assert resources.gpu_figures([], {101}) == []


def test_torchrun_workers_samples_and_stacks_are_their_ranks():
    """Node 0's engine (rank 0) runs workers 0 and 1; rank 1's engine is idle meanwhile."""
    base = {"t": 1.0, "mem_total": 16 << 30, "mem_avail": 8 << 30, "gpus": []}
    answers = {
        0: {"samples": [{**base, "cpu": 2.0, "rss": 90 * MIB, "workers": [
            {"rank": 0, "pid": 11, "cpu": 99.0, "rss": 300 * MIB, "gpus": []},
            {"rank": 1, "pid": 12, "cpu": 98.0, "rss": 700 * MIB, "gpus": []}]}]},
        1: {"samples": [{**base, "cpu": 0.5, "rss": 80 * MIB}]},
    }
    got = run_resources.by_rank(answers)
    assert {r: (s[0]["pid"], s[0]["rss"] // MIB) for r, s in got.items()} == {0: (11, 300), 1: (12, 700)}
    assert "workers" not in got[0][0]
    assert run_resources.by_rank({1: answers[1]})[1][0]["rss"] == 80 * MIB  # no workers: the engine's own

    def thread(name, frames, **mark):
        return {"thread": name, "main": True, "frames": frames, **mark}

    engine = [thread("MainThread", [["/x/site-packages/zmq/poll.py", 1, "poll", ""]])]
    cell = [["/tmp/jupyter-dist-torchrun-ab/distrun_cell.py", 4, "step", "dist.all_reduce(t)"]]
    stacks_answers = {0: [thread("w0", cell, worker=11, rank=0), thread("w1", cell, worker=12, rank=1), *engine],
                      1: engine}
    by = run_stacks.by_rank(stacks_answers)
    assert [g.ranks for g in run_stacks.group(by)] == [(0, 1)]
    assert run_stacks.headline(run_stacks.group(by)) == "ranks 0,1: dist.all_reduce at <cell>:4"


def test_py_spy_json_becomes_frames_outermost_first():
    dump = [{"thread_id": 7, "os_thread_id": 55, "thread_name": None, "frames": [
        {"name": "inner", "filename": "/nope/a.py", "line": 9}, {"name": "<module>", "filename": "/nope/a.py", "line": 2}]},
        {"thread_id": 8, "os_thread_id": 56, "thread_name": "loader", "frames": []}]
    got = stacks.py_spy_threads(dump, 55, {"worker": 55, "rank": None})
    assert got[0]["main"] and not got[1]["main"] and got[1]["thread"] == "loader"
    assert got[0]["frames"] == [["/nope/a.py", 2, "<module>", ""], ["/nope/a.py", 9, "inner", ""]]


def test_the_switch_turns_the_sampling_off(monkeypatch):
    resources.start(interval=0.05)
    monkeypatch.setenv(resources.SWITCH, "0")
    time.sleep(0.2)  # a sample in progress may still land
    t = time.time()
    time.sleep(0.3)
    assert resources.samples({"since": t})["samples"] == []
    cost = resources.cost()
    assert cost["wall_s"] > 0 and cost["cpu_s"] >= 0
