"""cluster/session_weight.py, run/flood.py and engine/flood_signal.py: a crowded node's engines' session weighs
less while the ranks' output floods the kernel (raised by the kernel, or by a rank that starts flooding), and
returns to its base once it calms down; against real sessions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from jupyter_dist.cluster.session_weight import REREAD_S, SessionWeight
from jupyter_dist.common.autogroup import parse_nice, write_nice
from jupyter_dist.common.flood_level import FLOOD_NICE, flood_nice
from jupyter_dist.engine.flood_signal import FloodSignal, counted
from jupyter_dist.run.flood import CALM_S, FLOOD_CHARS, FloodWatch

pytestmark = pytest.mark.timeout(60)


def nice_of(pid: int) -> int | None:
    with open(f"/proc/{pid}/autogroup") as f:
        return parse_nice(f.read())


@pytest.fixture
def session() -> Iterator[int]:
    """A real process leading a session of its own (as the fork server of a crowded node does)."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc.pid
    proc.kill()
    proc.wait()


def test_the_nice_of_an_autogroup_line():
    assert parse_nice("/autogroup-123 nice 0\n") == 0
    assert parse_nice("/autogroup-9 nice 7") == 7
    assert parse_nice("") is None and parse_nice("/autogroup-9 nice x") is None


def test_the_level_comes_from_the_environment_within_0_to_19():
    assert flood_nice({}) == FLOOD_NICE == 9
    assert flood_nice({"JUPYTER_DIST_FLOOD_NICE": "0"}) == 0
    assert flood_nice({"JUPYTER_DIST_FLOOD_NICE": "40"}) == 19
    assert flood_nice({"JUPYTER_DIST_FLOOD_NICE": "much"}) == FLOOD_NICE


def test_a_flood_raises_the_sessions_nice_and_its_end_sets_the_base_again(session):
    weight = SessionWeight(session, nice=9)
    assert weight.base == nice_of(session) == 0 and weight.active
    weight.flooded(True)
    assert nice_of(session) == 9 == weight.current
    weight.flooded(True)  # nothing to change: no write
    time.sleep(0.2)
    weight.flooded(False)
    assert nice_of(session) == 0 == weight.current


def test_level_0_or_a_session_gone_changes_nothing(session):
    off = SessionWeight(session, nice=0)
    assert not off.active
    off.flooded(True)
    assert nice_of(session) == 0
    gone = SessionWeight(2**22 + 12345, nice=9)  # no such process
    assert gone.base is None and not gone.active
    gone.flooded(True)


# Linux takes one autogroup change per 0.1 s from a process without CAP_SYS_ADMIN in the first user
# namespace, and lets it lower a nice back to 0 without privilege: a user namespace of its own (root
# mapped to this user) is such a process, here as for any user.
UNPRIVILEGED = """
import json, subprocess, sys, time
from jupyter_dist.cluster.session_weight import SessionWeight
from jupyter_dist.common.autogroup import parse_nice
p = subprocess.Popen(["sleep", "30"], start_new_session=True)
nice = lambda: parse_nice(open(f"/proc/{p.pid}/autogroup").read())
seen = []
for _ in range(5):  # a loaded machine may pause this process past Linux's 0.1 s between the two
    w = SessionWeight(p.pid, nice=9)
    w.flooded(True)
    end = time.monotonic() + 3  # a raise refused (another change machine-wide) is tried at the next call
    while nice() != 9 and time.monotonic() < end:
        time.sleep(0.05); w.flooded(True)
    raised = nice()
    w.flooded(False); at_once = nice()  # refused as too soon: a timer tries again
    time.sleep(1.0)
    seen.append([raised, at_once, nice(), w.current])
print(json.dumps(seen))
p.kill()
"""


def test_without_privilege_a_refused_return_to_the_base_is_tried_again_and_lands():
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.fail("util-linux's unshare is needed for this test")
    out = subprocess.run([unshare, "--user", "--map-root-user", sys.executable, "-c", UNPRIVILEGED],
                         capture_output=True, text=True, timeout=30, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert all(raised == 9 and later == 0 == current for raised, _, later, current in seen), seen
    assert any(at_once == 9 for _, at_once, _, _ in seen), seen  # Linux said EAGAIN, the timer set it later


class Target:
    """What FloodWatch tells, recorded; `raised`: what the ranks' session says when looked at."""

    def __init__(self) -> None:
        self.told: list[bool] = []
        self.looks: list[bool] = []  # each look's `force`
        self.raised = False

    def set_output_flood(self, on: bool) -> None:
        self.told.append(on)

    def output_flood_raised(self, force: bool = False) -> bool:
        self.looks.append(force)
        return self.raised


def test_a_flood_lasts_from_a_backlog_or_a_large_drain_until_calm():
    target = Target()
    watch = FloodWatch(target)
    watch.after_drain(False, 300, 0.0)  # a line or two, a round of progress bars: no flood
    watch.after_drain(True, 300, 1.0)  # fell behind
    watch.after_drain(False, 0, 1.0 + CALM_S / 2)  # caught up for a moment: still flooded
    watch.after_drain(False, 0, 1.0 + CALM_S + 0.01)
    watch.after_drain(False, FLOOD_CHARS, 5.0)  # kept up, but with a flood's worth
    watch.end()
    assert target.told == [False, True, True, False, True, False]
    assert target.looks == [False, True]  # looked while off with text to hand on, and at the end, forced


def test_a_raise_by_the_ranks_counts_as_a_flood_until_calm():
    target = Target()
    watch = FloodWatch(target)
    watch.after_drain(False, 0, 0.0)  # nothing to hand on: no look
    target.raised = True  # a rank started a flood before this kernel could drain it
    watch.after_drain(False, 500, 0.1)
    target.raised = False  # taken as raised here: the weight reports it once
    watch.after_drain(False, 500, 0.1 + CALM_S / 2)  # on: no look
    watch.after_drain(False, 500, 0.1 + CALM_S + 0.01)  # calm: back to the base, and a look
    assert target.told == [False, True, True, False]
    assert target.looks == [False, False]


def test_a_raise_by_the_ranks_is_noticed_and_set_back(session):
    weight = SessionWeight(session, nice=9)
    assert not weight.raised_by_ranks()  # at its base
    assert write_nice(f"/proc/{session}/autogroup", 9) == 0  # as a flooding rank does to its own session
    assert not weight.raised_by_ranks()  # looked a moment ago: not again before REREAD_S
    assert weight.raised_by_ranks(force=True) and weight.current == 9
    assert not weight.raised_by_ranks(force=True)  # raised here now: nothing more to notice
    weight.flooded(True)  # the watch's flood: already there
    time.sleep(0.2)
    weight.flooded(False)
    assert nice_of(session) == 0 == weight.current
    time.sleep(REREAD_S)
    assert not weight.raised_by_ranks()


def test_a_rank_signals_once_a_cell_when_its_text_comes_fast():
    now = [0.0]
    calls: list[float] = []
    signal = FloodSignal(lambda: calls.append(now[0]), chars=1000, window_s=0.25, clock=lambda: now[0])
    write = counted(lambda text: len(text), signal)
    assert write("x" * 5000) == 5000  # not armed (not a %%distrun cell on a crowded node): not counted
    assert calls == []
    signal.arm()
    for _ in range(10):  # 400 characters a second: a training log, never a flood
        now[0] += 0.1
        write("y" * 40)
    assert calls == []
    now[0] += 0.05
    write("z" * 600)
    write("z" * 600)  # 1,200 within 0.25 s of the count's start
    assert calls == [now[0]] and not signal.armed
    write("z" * 5000)
    assert len(calls) == 1  # once a cell
    signal.arm()
    write("w" * 1000)
    assert len(calls) == 2


LIGHTEN = """
import json, os, subprocess, sys
from jupyter_dist.common.autogroup import parse_nice
from jupyter_dist.engine.flood_signal import lighten_session
nice = lambda: parse_nice(open("/proc/self/autogroup").read())
seen = [nice()]
lighten_session(9); seen.append(nice())
lighten_session(5); seen.append(nice())  # never lowers what is there
print(json.dumps(seen))
"""


def test_a_rank_lightens_its_own_session():
    out = subprocess.run([sys.executable, "-c", LIGHTEN], capture_output=True, text=True, timeout=30,
                         start_new_session=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [0, 9, 9]
