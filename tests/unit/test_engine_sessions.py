"""engine/sessions.py: an engine leaves the kernel's session (its scheduler autogroup) for one of its own, as
torchrun's workers are started, and keeps a process group whose id is its pid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_dist.common.process_group import own_group

pytestmark = pytest.mark.timeout(60)

PROBE = ("import json, os; from jupyter_dist.engine.sessions import own_session; moved = own_session(); "
         "print(json.dumps([moved, os.getpid(), os.getsid(0), os.getpgid(0), own_session()]))")


def probe(env: dict[str, str] | None = None, **kwargs: object) -> tuple[bool, int, int, int, bool]:
    """A real child, started as mpiexec starts a rank (a process-group leader in this session) unless told."""
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=30, check=True,
                         env={**os.environ, **(env or {})}, **kwargs)
    moved, pid, sid, pgid, again = json.loads(out.stdout)
    return moved, pid, sid, pgid, again


def test_a_group_leader_moves_to_a_session_and_group_of_its_own():
    moved, pid, sid, pgid, again = probe(**own_group())
    assert moved and sid == pid and pgid == pid  # stoppable by its group as before, its own autogroup now
    assert not again  # once moved, it stays


def test_a_process_in_its_parents_group_moves_too():
    moved, pid, sid, pgid, _ = probe()
    assert moved and sid == pid == pgid and sid != os.getsid(0)


def test_the_switch_keeps_it_in_this_session():
    moved, pid, sid, pgid, _ = probe({"JUPYTER_DIST_OWN_SESSION": "0"}, **own_group())
    assert not moved and sid == os.getsid(0) and pgid == pid


def test_a_session_leader_stays():
    moved, pid, sid, _, _ = probe(start_new_session=True)
    assert not moved and sid == pid


def test_a_leader_whose_parent_left_for_another_session_keeps_its_own_group():
    # the middle process starts the probe as a group leader, then moves to a new session itself: the probe's
    # parent group is in another session, setpgid fails, and the probe must end in a group of its own
    middle = ("import subprocess, sys, os\n"
              f"p = subprocess.Popen([sys.executable, '-c', 'input(); ' + {PROBE!r}], stdin=subprocess.PIPE, "
              "stdout=subprocess.PIPE, text=True, process_group=0)\n"
              "os.setsid()\n"
              "print(p.communicate('go\\n', timeout=30)[0], end='')\n")
    out = subprocess.run([sys.executable, "-c", middle], capture_output=True, text=True, timeout=30, check=True)
    moved, pid, sid, pgid, _ = json.loads(out.stdout)
    assert not moved and pgid == pid and sid != pid


def test_a_node_with_more_ranks_than_two_a_core_is_crowded():
    from jupyter_dist.common.crowding import crowded

    assert [crowded(r, 2) for r in (1, 4, 5, 8, 32, 64)] == [False, False] + [True] * 4
    assert not crowded(32, 16) and crowded(33, 16) and crowded(3, 0)


def test_a_crowded_nodes_rank_stays_in_the_session_its_parent_leads():
    # as the fork server (cluster/zygote.py) starts in a session of its own and forks the node's ranks:
    # 32 ranks on this machine's cores are crowded, 1 is not
    leader = ("import subprocess, sys, os\n"
              f"out = subprocess.run([sys.executable, '-c', {PROBE!r}], capture_output=True, text=True, "
              "timeout=30, check=True).stdout\n"
              "print(os.getpid(), out, end='')\n")
    got = {}
    for ranks in (1, 16 * len(os.sched_getaffinity(0))):
        out = subprocess.run([sys.executable, "-c", leader], capture_output=True, text=True, timeout=30,
                             check=True, start_new_session=True, env={**os.environ, "LOCAL_WORLD_SIZE": str(ranks)})
        server, rest = out.stdout.split(" ", 1)
        moved, pid, sid, _, _ = json.loads(rest)
        got[ranks] = (moved, sid == int(server), sid == pid)
    assert got[1] == (True, False, True)  # not crowded: a session of its own, as torchrun's workers
    assert got[16 * len(os.sched_getaffinity(0))] == (False, True, False)  # crowded: its parent's


NICE_PROBE = ("import os, time; from jupyter_dist.engine.sessions import own_session; own_session(); "
              "end = time.monotonic() + 20\n"
              "while time.monotonic() < end and ' nice 0' in open('/proc/self/autogroup').read() and "
              "os.environ['LOCAL_WORLD_SIZE'] != '1':\n    time.sleep(0.05)\n"
              "print(open('/proc/self/autogroup').read().split()[-1])")


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="a Linux kernel without scheduler autogroups")
def test_an_engine_of_a_crowded_node_in_a_session_of_its_own_lowers_its_weight_and_not_the_kernels():
    from jupyter_dist.engine.sessions import CROWDED_NICE

    crowded = 16 * len(os.sched_getaffinity(0))
    mine = Path("/proc/self/autogroup").read_text()
    got = {}
    for ranks in (1, crowded):
        out = subprocess.run([sys.executable, "-c", NICE_PROBE], capture_output=True, text=True, timeout=40,
                             check=True, env={**os.environ, "LOCAL_WORLD_SIZE": str(ranks)}, **own_group())
        got[ranks] = int(out.stdout)
    assert got == {1: 0, crowded: CROWDED_NICE} and CROWDED_NICE > 0  # parent (this test) leads no session
    assert Path("/proc/self/autogroup").read_text() == mine  # this session's (the test's) untouched
