"""The cluster's process helpers on a real child process (a `sleep`), and its owner-only folders."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from jupyter_dist.cluster import processes
from jupyter_dist.cluster.profile import lock_down, make_profile_dir, state_dir
from jupyter_dist.plan.settings import settings


def test_a_child_in_a_group_of_its_own_is_found_and_killed():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        assert processes.pid_alive(child.pid)
        assert child.pid in {p.pid for p in processes.process_tree([os.getpid()])}
        groups = processes.own_groups([child.pid, os.getpid()])
        assert groups == {child.pid}
        assert [p.pid for p in processes.group_members(groups)] == [child.pid]
        processes.kill_all(processes.process_tree([child.pid]), grace=5)
        assert child.wait(5) is not None
    finally:
        child.kill()
        child.wait()
    assert not processes.pid_alive(child.pid)
    assert processes.process_tree([child.pid]) == []


def test_profile_dirs_are_the_owners_only(tmp_path, monkeypatch):
    monkeypatch.setattr(settings(), "state_dir", str(tmp_path / "state"))
    assert state_dir() == tmp_path / "state"
    profile = make_profile_dir("jd-1-abc")
    assert profile == tmp_path / "state" / "profiles" / "jd-1-abc"
    (profile / "security").mkdir(mode=0o755)
    (profile / "security" / "engine.json").write_text("{}")
    lock_down(profile)
    for path, mode in ((tmp_path / "state", 0o700), (profile / "security", 0o700),
                       (profile / "security" / "engine.json", 0o600)):
        assert stat.S_IMODE(path.stat().st_mode) == mode
