"""The configuration panel as a view: controls <-> the defaults store, the preview, the buttons."""

from __future__ import annotations

from typing import Any

import pytest
from nodes import HERE
from plugin_framework import plugin_registered

from jupyter_dist.cluster.shape import ClusterShape
from jupyter_dist.plan import spec as specmod
from jupyter_dist.plan.defaults import DefaultsStore, RunDefaults
from jupyter_dist.plan.layout import build_layout
from jupyter_dist.plan.plan import TORCHRUN_MASTER_PORT
from jupyter_dist.run.session import DistSession
from jupyter_dist.views import panel as panelmod
from jupyter_dist.views.panel import AUTO, Panel
from jupyter_dist.views.panel_html import grid_html
from jupyter_dist.views.preview import PREVIEW_LIMIT, preview

pytestmark = pytest.mark.timeout(60)

NODE = HERE


class FakeControl:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.current: dict[str, Any] = {"state": "stopped", "engines": 0, "expected": 0, "ranks": []}

    def status(self) -> dict[str, Any]:
        return self.current

    def start(self) -> None:
        self.calls.append("start")
        self.current = {"state": "idle", "engines": 2, "expected": 2, "launcher": "local",
                        "ranks": [{"rank": 0, "state": "idle", "host": "127.0.0.1"},
                                  {"rank": 1, "state": "busy", "host": "127.0.0.1"}]}

    def stop(self) -> None:
        self.calls.append("stop")
        self.current = {"state": "stopped", "engines": 0, "expected": 0, "ranks": []}

    def restart(self) -> None:
        raise RuntimeError("engines would not come up")


@pytest.fixture
def session() -> DistSession:
    s = DistSession(store=DefaultsStore())
    s._local_node = NODE
    return s


@pytest.fixture
def made(session: DistSession):
    ctl = FakeControl()
    p = Panel(session, ctl, mpiexec_found=True)
    yield p, ctl, session.store
    p.close()


def test_controls_write_the_store(made):
    p, _, store = made
    p.framework.value = "mpi"
    p.nodes.value = 3
    p.procs.value = 4  # disabled while "auto" in a browser; still written when set
    p.backend.value = "gloo"
    p.ib.value = "off"
    p.launcher.value = "local"
    d = store.value
    assert (d.framework, d.nodes, d.procs_per_node, d.backend, d.ib, d.launcher) == ("mpi", 3, 4, "gloo", "off", "local")
    assert p.procs_auto.value is False
    p.procs_auto.value = True
    p.launcher.value = AUTO
    assert store.value.procs_per_node is None and store.value.launcher is None
    assert p.procs.value == 2  # no GPUs here: auto means 2
    p.no_timeout.value = False
    assert store.value.timeout == p.timeout.value
    p.timeout.value = 30.5
    assert store.value.timeout == 30.5
    p.no_timeout.value = True
    assert store.value.timeout is None and p.timeout.disabled


def test_store_changes_update_the_controls_without_feedback(made):
    p, _, store = made
    calls: list[RunDefaults] = []
    store.subscribe(calls.append)
    store.update(framework="mpi", procs_per_node=3, timeout=12.5, hosts=("n1", "n2"), nodes=2, launcher="local", ib="on")
    assert len(calls) == 1  # the panel's redraw wrote nothing back
    assert (p.framework.value, p.procs.value, p.procs_auto.value) == ("mpi", 3, False)
    assert (p.timeout.value, p.no_timeout.value) == (12.5, False)
    assert p.hosts.value == "n1,n2" and p.nodes.value == 2 and p.nodes.disabled
    assert p.launcher.value == "local" and p.ib.value == "on"
    store.reset()
    assert len(calls) == 2
    assert p.framework.value == "pytorch" and p.procs_auto.value and p.launcher.value == AUTO
    assert p.hosts.value == "" and not p.nodes.disabled and p.no_timeout.value


def test_distrun_flags_update_the_panel(made):
    p, _, store = made
    # what `%%distrun -f mpi -N 2 -n 3 --timeout 9` parses to and writes back (session.run)
    spec = specmod.resolve(specmod.parse_args("-f mpi -N 2 -n 3 --timeout 9"), store.value, mpiexec_found=True)
    store.update(**specmod.remembered(spec))
    assert (p.framework.value, p.nodes.value, p.procs.value, p.timeout.value) == ("mpi", 2, 3, 9.0)
    assert p.preview.world_size == 6
    # and what the panel sets is what the next flag-less %%distrun resolves to
    p.framework.value = "pytorch"
    p.procs.value = 1
    nxt = specmod.resolve(specmod.parse_args(""), store.value, mpiexec_found=True)
    assert (nxt.framework, nxt.nodes, nxt.procs_per_node, nxt.timeout) == ("pytorch", 2, 1, 9.0)


def test_invalid_hosts_are_refused_with_a_message(made):
    p, _, store = made
    p.hosts.value = "node1, bad host"
    assert store.value.hosts == () and store.value.nodes == 1
    assert "not a valid host name" in p.hosts_msg.value and "not saved" in p.hosts_msg.value
    p.hosts.value = "999.1.1.1"  # digits and dots: a malformed address, not a name
    assert store.value.hosts == ()
    p.hosts.value = " node1 , 10.0.0.2 "
    assert store.value.hosts == ("node1", "10.0.0.2") and store.value.nodes == 2
    assert p.hosts_msg.value == "" and p.hosts.value == "node1,10.0.0.2" and p.nodes.disabled
    p.hosts.value = ""
    assert store.value.hosts == () and not p.nodes.disabled


def test_preview_follows_the_controls(made):
    p, _, _ = made
    p.nodes.value = 2
    p.procs.value = 3
    assert "world size 6" in p.summary.value and "backend gloo" in p.summary.value
    assert p.rank.max == 5
    assert "node 1" in p.grid.value and ">5</td>" in p.grid.value and ">6</td>" not in p.grid.value
    p.rank.value = 4
    env = p.preview.envs[4]
    assert (env["RANK"], env["LOCAL_RANK"], env["NODE_RANK"], env["WORLD_SIZE"]) == ("4", "1", "1", "6")
    assert env["MASTER_PORT"] == str(TORCHRUN_MASTER_PORT) and env["JUPYTER_DIST_FRAMEWORK"] == "pytorch"
    assert "<code>RANK</code></td><td><code>4</code>" in p.env.value and "placeholder" in p.env.value
    p.framework.value = "mpi"
    assert "<code>OMPI_COMM_WORLD_RANK</code></td><td><code>4</code>" in p.env.value
    p.procs.value = 1  # the rank selector follows the world size
    assert p.rank.max == 1 and p.rank.value == 1
    assert p.preview.envs[1]["OMPI_COMM_WORLD_SIZE"] == "2"


def test_preview_says_why_a_run_would_fail(made):
    p, _, _ = made
    p.backend.value = "nccl"  # no GPUs on the fake node
    assert "would fail" in p.summary.value and "--backend nccl" in p.summary.value
    assert p.env.value == ""


def test_preview_takes_the_running_clusters_ports_when_its_shape_matches():
    d = RunDefaults(nodes=2, procs_per_node=2, launcher="local")
    running = (ClusterShape("local", 4, ()), 41000, (41001, 41002, 41003, 41004))
    p = preview(d, NODE, mpiexec_found=True, running=running)
    assert p.real_port and p.ports.master == 41000
    assert p.envs[3]["MASTER_PORT"] == "41000" and p.problem is None
    other = preview(RunDefaults(nodes=1, procs_per_node=2, launcher="local"), NODE, mpiexec_found=True, running=running)
    assert not other.real_port and other.envs[1]["MASTER_PORT"] == str(TORCHRUN_MASTER_PORT)


def test_preview_of_a_huge_world_skips_the_environments():
    nodes = PREVIEW_LIMIT // 1024 + 1
    p = preview(RunDefaults(nodes=nodes, procs_per_node=1024, launcher="local"), NODE, mpiexec_found=True)
    assert p.world_size == nodes * 1024 > PREVIEW_LIMIT and p.envs == {} and p.ports.tasks == ()
    assert f"the environment preview is shown for world sizes up to {PREVIEW_LIMIT}" in p.notes


def test_preview_of_defaults_that_do_not_resolve_has_only_the_problem():
    p = preview(RunDefaults(framework="nope"), NODE, mpiexec_found=True)
    assert "-f/--framework must be one of" in (p.problem or "") and p.layout is None and p.world_size == 0


def test_framework_dropdown_offers_the_registry(session: DistSession, monkeypatch):
    with plugin_registered(monkeypatch):
        p = Panel(session, FakeControl(), mpiexec_found=True)
        try:
            assert ("PyTorch RPC", "rpc") in p.framework.options
            assert p.framework.options[0] == ("PyTorch DDP", "pytorch")
            p.framework.value = "rpc"
            assert session.store.value.framework == "rpc"
            assert p.preview.envs[0]["RPC_WORKER_NAME"] == "worker0"
        finally:
            p.close()


def test_large_grid_is_elided():
    layout = build_layout(20, 40, master_port=1)
    text = grid_html(layout)
    assert "12 more node(s)" in text and "24 more" in text and ">799<" not in text


def test_buttons_drive_the_control_and_the_status_line(made):
    p, ctl, _ = made
    assert "stopped" in p.status.value and p.stop_button.disabled
    p.start_button.click()
    assert ctl.calls == ["start"]
    assert "2/2 engines up" in p.status.value and "rank 1 busy" in p.status.value
    assert not p.stop_button.disabled
    p.restart_button.click()
    assert "restart failed: engines would not come up" in p.status.value
    p.stop_button.click()
    assert ctl.calls == ["start", "stop"] and "stopped" in p.status.value
    assert "failed" not in p.status.value


def test_status_listener_keeps_the_comms(session: DistSession):
    heard: list[str] = []
    session.cluster.on_status = lambda: heard.append("comm")
    ctl = FakeControl()
    p = Panel(session, ctl, mpiexec_found=True)
    ctl.start()
    session.cluster._notify()
    assert heard == ["comm"] and "2/2 engines up" in p.status.value
    q = Panel(session, FakeControl(), mpiexec_found=True)
    assert len(session.cluster.on_status.listeners) == 3  # type: ignore[union-attr]
    p.close()
    q.close()
    session.cluster._notify()
    assert heard == ["comm", "comm"] and len(session.cluster.on_status.listeners) == 1  # type: ignore[union-attr]


def test_load_ext_after_a_panel_keeps_the_panel_listening(session: DistSession, monkeypatch):
    """`%load_ext` adds the sidebar's status callback beside an open panel's, once however often it runs."""
    import jupyter_dist
    from jupyter_dist.ui import sidebar as comm
    heard: list[str] = []
    monkeypatch.setattr(comm.Sidebar, "notify_status", lambda self: heard.append("comm"))
    monkeypatch.setattr(comm, "register", lambda ip, sidebar: None)
    monkeypatch.setattr(jupyter_dist, "_session", session)
    monkeypatch.setattr(jupyter_dist, "_sidebar", None)
    p = Panel(session, FakeControl(), mpiexec_found=True)
    try:
        sidebars = []
        for _ in range(2):
            jupyter_dist.load_ipython_extension(FakeShell())
            sidebars.append(jupyter_dist._sidebar)
        assert sidebars[0] is sidebars[1] and sidebars[0].store is session.store  # one per kernel
        heard.clear()
        session.cluster._notify()
        listeners = session.cluster.on_status.listeners  # type: ignore[union-attr]
        assert heard == ["comm"] and p.refresh_status in listeners and len(listeners) == 2
    finally:
        p.close()


class FakeShell:
    def register_magics(self, magics: Any) -> None:
        pass


def test_panel_is_one_per_session_and_dist_panel_shows_it(session: DistSession, monkeypatch):
    from IPython.testing.globalipapp import get_ipython

    from jupyter_dist.ui.magics import DistMagics

    ip = get_ipython()  # the test shell every module shares (tests/conftest.py's too)

    first = panelmod.panel(session)
    try:
        assert panelmod.panel(session) is first
        assert "application/vnd.jupyter.widget-view+json" in first._repr_mimebundle_()
        shown: list[Any] = []
        monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
        DistMagics(ip, session).dist("panel")
        assert shown == [first]
        with pytest.raises(Exception, match="no arguments"):
            DistMagics(ip, session).dist("panel extra")
    finally:
        first.close()
    assert panelmod.panel(session) is not first
    panelmod.panel(session).close()
