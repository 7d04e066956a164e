"""launch_session: ipyparallel's launchers start their processes in this session, in a group of their own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from ipyparallel.cluster import launcher

from jupyter_dist.cluster.launch_session import in_this_session
from jupyter_dist.common.process_group import own_group

pytestmark = pytest.mark.timeout(60)


def test_a_new_session_becomes_a_new_group_in_this_session():
    with in_this_session():
        proc = launcher.Popen([sys.executable, "-c", "import os; print(os.getsid(0), os.getpgid(0))"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    out, _ = proc.communicate(timeout=30)
    sid, pgid = (int(v) for v in out.split())
    assert sid == os.getsid(0)  # the same scheduler autogroup as this process
    assert pgid == proc.pid != os.getpgid(0)  # out of this group's signals


def test_the_patch_is_undone_and_other_calls_are_left_alone():
    original = launcher.Popen
    with in_this_session():
        assert launcher.Popen is not original
        proc = launcher.Popen([sys.executable, "-c", "import os; print(os.getpgid(0))"], stdout=subprocess.PIPE,
                              text=True)
        assert int(proc.communicate(timeout=30)[0]) == os.getpgid(0)  # no new group asked: none made
    assert launcher.Popen is original


def test_own_group_kwargs_make_a_group():
    proc = subprocess.Popen([sys.executable, "-c", "import os; print(os.getpgid(0))"], stdout=subprocess.PIPE,
                            text=True, **own_group())
    assert int(proc.communicate(timeout=30)[0]) == proc.pid
