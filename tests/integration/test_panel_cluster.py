"""The panel against real engines: one 1 node x 2 processes cluster, started and stopped by its buttons."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.engines, pytest.mark.timeout(180)]


def test_panel_starts_runs_and_stops_a_cluster(shell, distrun):
    import jupyter_dist
    session = jupyter_dist.get_session()
    sidebar = jupyter_dist._sidebar  # the sidebar comm's side of this kernel, made by %load_ext
    p = jupyter_dist.panel()
    try:
        p.framework.value = "mpi"
        p.procs_auto.value = False
        p.procs.value = 2
        assert "stopped" in p.status.value and p.stop_button.disabled

        p.start_button.click()
        assert session.cluster.running, p.status.value
        assert "2/2 engines up" in p.status.value and p.status.value.count(" idle</span>") == 2
        assert sidebar.cluster_status()["engines"] == 2  # the sidebar's listener still hears the cluster
        pids = [e.pid for e in session.cluster.engines]

        # a run with explicit flags updates the panel; the panel's cluster is reused as is
        distrun("-f mpi -N 1 -n 2 --timeout 60 -o env", "import os\nenv = dict(os.environ)")
        assert p.timeout.value == 60.0 and not p.no_timeout.value
        assert [e.pid for e in session.cluster.engines] == pids
        assert "idle" in p.status.value and "busy" not in p.status.value
        # the preview is what the ranks got (with the running cluster's real master port)
        assert p.preview.real_port
        for rank, seen in enumerate(shell.user_ns["env"]):
            expected = p.preview.envs[rank]
            assert {k: seen.get(k) for k in expected} == expected

        p.stop_button.click()
        assert not session.cluster.running
        assert "stopped" in p.status.value and "0/0 engines up" in p.status.value
        assert sidebar.cluster_status()["state"] == "stopped"
    finally:
        p.close()
