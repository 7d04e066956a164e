"""views/kept_threads.py: a live view's timer loops run on threads kept from run to run."""

from __future__ import annotations

import threading

import pytest

from jupyter_dist.views.kept_threads import KeptThreads

pytestmark = pytest.mark.timeout(30)


def test_a_run_after_another_reuses_the_kept_threads():
    pool = KeptThreads("test-kept")
    names: list[str] = []
    for _ in range(5):  # one run after another: two loops each
        stop = threading.Event()
        def loop(stop: threading.Event = stop) -> None:
            names.append(threading.current_thread().name)
            stop.wait()

        loops = [pool.run(loop) for _ in range(2)]
        stop.set()
        assert all(done.wait(5) for done in loops)
    assert pool.started == 2 and len(names) == 10 and set(names) <= {"test-kept-1", "test-kept-2"}


def test_a_loop_that_does_not_end_never_delays_the_next_one_and_a_failure_keeps_the_thread():
    pool = KeptThreads("test-stuck")
    stuck = threading.Event()
    first = pool.run(stuck.wait)
    assert pool.run(lambda: 1 / 0).wait(5)  # a new thread, not the stuck one; its error is swallowed
    ran = threading.Event()
    assert pool.run(ran.set).wait(5) and ran.is_set()
    assert pool.started == 2 and not first.is_set()
    stuck.set()
    assert first.wait(5)


def test_a_run_after_the_last_one_ended_reuses_its_thread():
    pool = KeptThreads("test-reuse")
    for _ in range(20):  # the thread is marked idle before `done` is set, so none is started twice
        assert pool.run(lambda: None).wait(5)
    assert pool.started == 1
