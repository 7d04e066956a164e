"""Who can reach the cluster: loopback listeners only, owner-only files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import psutil
import pytest

import jupyter_dist

pytestmark = [pytest.mark.engines, pytest.mark.timeout(180)]


def listeners(pid: int) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    p = psutil.Process(pid)
    for q in [p, *p.children(recursive=True)]:
        try:
            conns = q.net_connections(kind="inet")
            name = " ".join(q.cmdline()[:3])
        except psutil.Error:
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN:
                out.setdefault(name, set()).add(c.laddr.ip)
    return out


def test_controller_and_engines_listen_on_loopback_only(distrun):
    distrun("-N 1 -n 2", "x = 1")
    c = jupyter_dist.get_session().cluster
    found: dict[str, set[str]] = {}
    for pid in c._cluster_pids() + [e.pid for e in c.engines]:
        for name, addrs in listeners(pid).items():
            found.setdefault(name, set()).update(addrs)
    ours = {n: a for n, a in found.items() if "ipyparallel" in n}
    assert any("controller" in n for n in ours) and any("ipyparallel.engine" in n for n in ours)
    for name, addrs in ours.items():
        assert addrs <= {"127.0.0.1", "::1"}, (name, addrs)
    # Open MPI's launcher (prterun) keeps its out-of-band listener on all interfaces: PRRTE refuses
    # loopback-only OOB ("No network interfaces were found"); see docs/reliability.md.


def test_connection_and_log_files_are_owner_only(distrun):
    distrun("-N 1 -n 2", "print('to the log')")
    session = jupyter_dist.get_session()
    profile = Path(session.cluster._cluster.profile_dir)
    files = [p for p in (profile / "security").iterdir() if p.is_file()]
    assert files
    logs = session.last_outcome.log_dir
    files += list(logs.iterdir())
    for f in files:
        mode = stat.S_IMODE(os.stat(f).st_mode)
        assert mode & 0o077 == 0, (f, oct(mode))
    for d in (profile, logs):
        assert stat.S_IMODE(os.stat(d).st_mode) & 0o077 == 0, d
