"""A worker's collectives (--fresh's child, torchrun's workers): asked on its socket from a real child
process, and taken as its rank's by the notebook (the merge is pure: answers shaped by hand)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import pytest

from jupyter_dist.engine import worker_collectives
from jupyter_dist.run.desync import desync_lines, records_by_rank

CHILD = ("import time\nfrom jupyter_dist.engine import collective_record, worker_collectives\n"
         "path = worker_collectives.serve()\n"
         "collective_record._begin('broadcast', (), {})\n"
         "print(path, flush=True)\n"
         "time.sleep(60)\n")


def rec(op: str, seq: int) -> dict:
    return {"op": op, "seq": seq, "group": "default", "start": 0.0, "tensors": [[[4], "float32"]]}


def record(flying=None, done=()) -> dict:
    return {"in_flight": [flying] if flying else [], "done": list(done), "now": 0.0}


@pytest.mark.timeout(60)
def test_a_worker_answers_for_its_collectives_on_its_socket():
    folder = tempfile.mkdtemp(prefix="jd-test-")
    env = {**os.environ, worker_collectives.SOCKETS_VAR: folder}
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, env=env)
    try:
        path = child.stdout.readline().strip()  # type: ignore[union-attr]
        assert path == worker_collectives.socket_path(folder, child.pid)
        t0 = time.monotonic()
        got = worker_collectives.ask([(1, child.pid)], folder)
        took = time.monotonic() - t0
        print(f"a worker's record asked in {took * 1000:.1f} ms")
        assert [(w["rank"], w["pid"]) for w in got] == [(1, child.pid)]
        assert [r["op"] for r in got[0]["in_flight"]] == ["broadcast"] and got[0]["done"] == []
    finally:
        child.kill()
        child.wait()
    assert "error" in worker_collectives.ask_one(child.pid, folder)  # gone: said, not raised


def test_without_its_engine_a_worker_records_but_serves_nothing(monkeypatch):
    monkeypatch.delenv(worker_collectives.SOCKETS_VAR, raising=False)
    assert worker_collectives.serve() is None


def test_torchrun_workers_records_are_their_ranks():
    """Node 0's engine runs torchrun; rank 1's engine is idle: worker 1's record is rank 1's."""
    answers = {0: {**record(), "workers": [{"rank": 0, "pid": 11, **record(rec("all_reduce", 1))},
                                           {"rank": 1, "pid": 12, **record(rec("broadcast", 1))}]},
               1: record()}
    got = records_by_rank(answers)
    assert got[0]["in_flight"][0]["op"] == "all_reduce" and got[1]["in_flight"][0]["op"] == "broadcast"
    assert desync_lines(got, world=(0, 1)) == ["rank 0 is in all_reduce #1 (4 floats); rank 1 is in broadcast #1 (4 floats)"]


def test_a_fresh_childs_record_is_its_engines_rank_and_a_silent_worker_is_named():
    answers = {0: {**record(), "workers": [{"rank": None, "pid": 11, **record(rec("all_reduce", 2))}]},
               1: {**record(), "workers": [{"rank": None, "pid": 12, "error": "TimeoutError: timed out"}]}}
    got = records_by_rank(answers)
    assert set(got) == {0} and "workers" not in got[0]
    assert desync_lines(got, world=(0, 1))[-1] == "rank 1 did not answer: its collectives are unknown"
