"""engine/sessions.py: an engine leaves the kernel's session (its scheduler autogroup) for one of its own, as
torchrun's workers are started, and keeps a process group whose id is its pid."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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
