"""Old log and profile folders removed past the limit, a live kernel's never (cluster/retention.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from IPython.core.error import UsageError

from jupyter_dist.cluster.retention import owner_pid, prune, usage
from jupyter_dist.ui.magics import parse_restart_ranks


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def make(folder, name: str, age: int) -> None:
    d = folder / name
    d.mkdir(parents=True)
    (d / "rank-0.stdout").write_text("x" * 10)
    os.utime(d, (1_000_000 + age, 1_000_000 + age))


def test_owner_pid_of_each_kind():
    assert owner_pid("jd-1234-ab12cd") == 1234
    assert owner_pid("20261204-075432-5235-2") == 5235
    assert owner_pid("hand-made") is None


def test_oldest_removed_past_the_limit_but_never_a_live_kernels(tmp_path):
    gone, live = dead_pid(), os.getpid()
    for i in range(5):
        make(tmp_path, f"2026010{i}-000000-{gone}-{i}", age=i)
    make(tmp_path, f"20250101-000000-{live}-1", age=-10)  # the oldest of all, but this kernel's
    removed = prune(tmp_path, keep=2)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [f"20250101-000000-{live}-1", f"20260103-000000-{gone}-3", f"20260104-000000-{gone}-4"]
    assert len(removed) == 3
    assert usage(tmp_path).count == 3 and usage(tmp_path).size == 30


def test_zero_keeps_everything(tmp_path):
    for i in range(3):
        make(tmp_path, f"jd-{dead_pid()}-{i}", age=i)
    assert prune(tmp_path, keep=0) == [] and len(list(tmp_path.iterdir())) == 3


@pytest.mark.parametrize(("rest", "ranks"), [(["--rank", "1"], [1]), (["--rank", "3,1"], [1, 3]), (["--rank=2"], [2])])
def test_restart_ranks_parsed(rest, ranks):
    assert parse_restart_ranks(rest, 4) == ranks


@pytest.mark.parametrize(("rest", "words"), [(["--rank", "4"], "ranks 0-3"), (["--rank", "a"], "numbers"),
                                             (["--ranks", "1"], "takes --rank")])
def test_restart_ranks_bad_input_named(rest, words):
    with pytest.raises(UsageError, match=words):
        parse_restart_ranks(rest, 4)
