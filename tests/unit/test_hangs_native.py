"""A py-spy dump cut to the cell's thread (run/hangs.py; pure)."""

from __future__ import annotations

from jupyter_dist.run.hangs import main_thread

DUMP = """Process 42: python -m ipyparallel.engine
Python v3.11.7 (/usr/bin/python3.11)

Thread 42 (active+gil): "MainThread"
    <module> (<cell>:2)
    run_code (IPython/core/interactiveshell.py:3577)
Thread 43 (idle): "IOPub"
    select (selectors.py:468)
"""


def test_only_the_main_thread_is_kept():
    assert main_thread(DUMP) == ['Thread 42 (active+gil): "MainThread"', "<module> (<cell>:2)",
                                 "run_code (IPython/core/interactiveshell.py:3577)"]


def test_a_dump_without_threads_is_kept_whole():
    assert main_thread("nothing\n") == ["nothing"]
