"""Failures as data (run/failures.py), without processes: order, deaths, timeouts, the messages."""

from __future__ import annotations

import pytest

from jupyter_dist.errors import RankFailure, RunTimeout
from jupyter_dist.plan.layout import RankPlace
from jupyter_dist.run import failures
from jupyter_dist.run.failures import Failure


def place(rank: int, per_node: int = 2) -> RankPlace:
    return RankPlace(rank, rank // per_node, rank % per_node, "127.0.0.1")


class RemoteError(Exception):
    """Stands in for ipyparallel's RemoteError: a name, a value and a rendered traceback."""

    def __init__(self, ename: str, evalue: str, tb: list[str]) -> None:
        super().__init__(evalue)
        self.ename, self.evalue, self.tb = ename, evalue, tb

    def render_traceback(self) -> list[str]:
        return self.tb


class EngineError(Exception):
    """ipyparallel's error for an engine that went away, matched by name."""


def raised(rank: int, when: float, message: str = "boom", lines: int = 3) -> Failure:
    tb = [f"tb line {i} of rank {rank}" for i in range(lines)] + [f"ValueError: {message}"]
    return failures.from_error(place(rank), RemoteError("ValueError", message, tb), when)


def test_errors_are_read_by_name_and_rendered():
    err = RemoteError("ValueError", "bad", ["Traceback", "ValueError: bad"])
    assert failures.error_name(err) == "ValueError: bad"
    assert failures.render_error(err) == ["Traceback", "ValueError: bad"]
    assert failures.render_error(RuntimeError("stuck")) == ["RuntimeError: stuck"]
    assert failures.is_engine_death(EngineError("gone"))
    assert not failures.is_engine_death(err)


def test_records_say_what_happened():
    f = raised(1, 2.0)
    assert (f.rank, f.what, f.when, f.error, f.died) == (1, "exception", 2.0, "ValueError: boom", False)
    assert f.traceback[-1] == "ValueError: boom"
    dead = failures.from_error(place(2), EngineError("engine died"), 3.0)
    assert (dead.what, dead.died, dead.exit_code, dead.traceback) == ("death", True, None, ())
    exited = failures.from_error(place(3), EngineError("engine died"), 3.0, exit_code=7)
    assert (exited.what, exited.exit_code) == ("exit", 7)
    assert f.where == "rank 1 (node 0, local rank 1)"


def test_the_first_by_time_is_named_and_the_others_were_waiting():
    err = failures.rank_failure([raised(3, 5.0, "late"), raised(2, 1.0, "bad shard")], finished=[0, 1])
    assert isinstance(err, RankFailure)
    assert err.summary == "rank 2 failed first (ValueError: bad shard); failed ranks: 2, 3"
    assert err.failed == [2, 3]
    text = "\n".join(err.report)
    assert err.report[0] == "--- rank 2 (node 1, local rank 0) failed first:"
    assert "tb line 0 of rank 2" in text
    assert "--- rank 3 (node 1, local rank 1) failed after it (was it waiting for rank 2?):" in text
    assert err.report[-1] == "--- finished normally: rank 0, 1"
    assert "restarts the cluster" not in text


def test_a_later_rank_shows_the_end_of_its_traceback_only():
    err = failures.rank_failure([raised(0, 1.0), raised(1, 2.0, lines=20)], finished=[])
    after = err.report[err.report.index("--- rank 1 (node 0, local rank 1) failed after it (was it waiting for rank 0?):") + 1:]
    assert len(after) == failures.OTHERS_SHOWN and after[-1] == "ValueError: boom"
    assert not any(line.startswith("--- finished normally") for line in err.report)


def test_equal_times_keep_the_order_they_came_in():
    order = failures.in_order([raised(4, 1.0), raised(1, 1.0)])
    assert [f.rank for f in order] == [4, 1]


def test_a_death_with_no_word_is_named_as_such():
    dead = failures.from_error(place(1), EngineError("engine died"), 1.0)
    err = failures.rank_failure([dead], finished=[0])
    assert err.summary == ("rank 1 died (its engine process ended with no exit code: a signal such as SIGKILL, "
                           "or the OOM killer); failed ranks: 1")
    assert err.report[:2] == ["--- rank 1 (node 0, local rank 1) failed first:", "its engine process ended with no exit code"]
    assert err.report[-1] == failures.DEATH_LINE
    assert "replaces the dead rank's engine" in err.report[-1]


def test_the_rank_the_launcher_names_comes_first_among_deaths():
    """mpiexec stops every rank when one dies: the one it names died, the others were stopped."""
    stopped = failures.from_error(place(0), EngineError("engine died"), 1.0)
    killed = failures.from_error(place(3), EngineError("engine died"), 1.5)
    other = raised(2, 1.2)
    records = failures.with_notes([stopped, killed, other], {3: "was killed by signal 9 (Killed)"})
    err = failures.rank_failure(records, finished=[1])
    assert err.summary == "rank 3 died (was killed by signal 9 (Killed)); failed ranks: 3, 0, 2"
    assert err.report[:2] == ["--- rank 3 (node 1, local rank 1) failed first:", "its engine process was killed by signal 9 (Killed)"]
    assert ("--- rank 0 (node 0, local rank 0): its engine was stopped too (mpiexec ends the whole job when one rank dies)"
            in err.report)
    assert "--- rank 2 (node 1, local rank 0) failed after it (was it waiting for rank 3?):" in err.report


def test_an_exception_first_stays_first_whatever_died_after():
    records = failures.with_notes([raised(1, 1.0), failures.from_error(place(0), EngineError("x"), 2.0)],
                                  {0: "exited with code 1"})
    assert [f.rank for f in failures.in_order(records)] == [1, 0]
    assert failures.rank_failure(records, []).summary.startswith("rank 1 failed first (ValueError: boom)")


def test_notes_from_exit_codes_and_crash_files():
    exited = failures.from_error(place(0), EngineError("x"), 1.0, exit_code=3)
    crashed = failures.from_error(place(1), EngineError("x"), 1.0)
    silent = failures.from_error(place(2), EngineError("x"), 1.0)
    crash = "Fatal Python error: Segmentation fault\n\nCurrent thread ...\n"
    notes = failures.local_notes([exited, crashed, silent, raised(3, 1.0)], {1: crash, 2: "", 3: crash})
    assert notes == {0: "exited with code 3", 1: "crashed: Segmentation fault"}
    err = failures.rank_failure(failures.with_notes([exited], notes), [])
    assert err.summary == "rank 0 died (exited with code 3); failed ranks: 0"


def test_timeout_lists_each_running_rank_with_its_stack():
    pending = [failures.stalled(place(0), 9.0, "File a.py, line 1\n  time.sleep(60)"), failures.stalled(place(2), 9.0, "")]
    err = failures.run_timeout(30.0, pending)
    assert isinstance(err, RunTimeout)
    assert err.summary == "the run passed --timeout 30 s; still running: rank(s) 0, 2"
    assert err.report == ["--- rank 0 was still running; its Python stack:", "File a.py, line 1", "  time.sleep(60)",
                          "--- rank 2 was still running; its Python stack:"]
    assert pending[0].what == "timeout"


def test_no_failure_is_not_a_report():
    with pytest.raises(ValueError):
        failures.rank_failure([], [0])


def test_a_crashed_rank_shows_its_crash_files_stacks():
    dead = failures.from_error(place(3), EngineError("engine died"), 1.0)
    crash = 'Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):\n  File "<cell>", line 4 in f\n'
    records = failures.with_crash_stacks(failures.with_notes([dead], failures.local_notes([dead], {3: crash})), {3: crash})
    err = failures.rank_failure(records, finished=[0, 1, 2])
    assert err.report[:3] == ["--- rank 3 (node 1, local rank 1) failed first:", "its engine process crashed: Segmentation fault",
                              "Fatal Python error: Segmentation fault"]
    assert '  File "<cell>", line 4 in f' in err.report
    assert failures.with_crash_stacks([dead], {}) == [dead]  # no crash file: nothing added
