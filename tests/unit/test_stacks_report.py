"""Grouping and rendering of every rank's stack (pure)."""

from __future__ import annotations

from jupyter_dist.run.stacks import group, headline, render

CELL = "/tmp/ipykernel_123/456.py"
TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def answer(*frames):
    return [{"thread": "MainThread", "main": True, "frames": [list(f) for f in frames]},
            {"thread": "other", "main": False, "frames": [["x.py", 1, "loop", ""]]}]


IN_ALL_REDUCE = answer((CELL, 41, "<module>", "dist.all_reduce(t)"), (TORCH, 2800, "all_reduce", "work.wait()"))
SLEEPING = answer((CELL, 37, "<module>", "time.sleep(600)"))


def test_ranks_in_the_same_place_are_grouped_largest_first():
    groups = group({0: IN_ALL_REDUCE, 1: SLEEPING, 2: IN_ALL_REDUCE, 3: IN_ALL_REDUCE})
    assert [g.ranks for g in groups] == [(0, 2, 3), (1,)]
    assert headline(groups) == "ranks 0,2,3: all_reduce at <cell>:41; rank 1: time.sleep at <cell>:37"


def test_library_frames_are_folded_and_missing_ranks_named():
    lines = render(group({0: IN_ALL_REDUCE}), missing={1: "no answer in time"})
    assert lines == [
        "rank 0: all_reduce at <cell>:41",
        "    <cell>:41 in <module>: dist.all_reduce(t)",
        "    ... 1 library frame, innermost all_reduce at distributed/distributed_c10d.py:2800",
        "rank 1: no stack (no answer in time)",
    ]
