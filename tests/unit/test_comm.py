"""The sidebar protocol: validation, the handlers, store pushes, and a real kernel over a subshell."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from plugin_framework import plugin_registered

from jupyter_dist import frameworks
from jupyter_dist.plan import validate
from jupyter_dist.plan.defaults import DefaultsStore, RunDefaults
from jupyter_dist.ui import sidebar as comm


@pytest.fixture
def store() -> DefaultsStore:
    return DefaultsStore()


@pytest.fixture
def hub(store: DefaultsStore) -> comm.Sidebar:
    """A kernel's sidebar side, on a store of its own."""
    return comm.Sidebar(store)


def greeted(hub: comm.Sidebar) -> tuple[comm.SidebarSession, list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []
    session = comm.SidebarSession(hub, sent.append)  # type: ignore[arg-type]
    session.handle({"type": "hello", "version": comm.PROTOCOL_VERSION})
    sent.clear()
    return session, sent


class FakeControl:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.current: dict[str, Any] = {"state": "idle", "engines": 4, "expected": 4, "ranks": []}

    def status(self) -> dict[str, Any]:
        return self.current

    def start(self) -> None:
        self.calls.append("start")

    def stop(self) -> None:
        self.calls.append("stop")

    def restart(self) -> None:
        raise RuntimeError("engines would not come up")


# ---------------------------------------------------------------------------- handshake


def test_hello_answers_welcome_then_state(hub):
    sent: list[dict[str, Any]] = []
    session = comm.SidebarSession(hub, sent.append)  # type: ignore[arg-type]
    session.handle({"type": "hello", "version": "1.0"})
    assert [m["type"] for m in sent] == ["welcome", "state"]
    welcome = sent[0]
    assert welcome["version"] == comm.PROTOCOL_VERSION
    assert welcome["frameworks"] == list(frameworks.registry())  # the one list, in its order
    assert welcome["frameworks"][0] == "pytorch" and "tensorflow" in welcome["frameworks"]
    assert welcome["framework_titles"]["pytorch"] == frameworks.registry()["pytorch"].title
    assert welcome["backends"] == ["auto", "nccl", "gloo", "mpi"]
    assert welcome["factory_defaults"] == RunDefaults().to_json()
    assert sent[1]["defaults"] == RunDefaults().to_json()
    assert sent[1]["status"] == comm.STOPPED_STATUS


def test_a_framework_added_through_the_entry_point_is_offered_and_accepted(hub, store, monkeypatch):
    with plugin_registered(monkeypatch):
        session, sent = greeted(hub)
        hub.add_session("a", session)
        hub.follow_store()
        welcome = comm.welcome()
        assert "rpc" in welcome["frameworks"] and welcome["framework_titles"]["rpc"] == "PyTorch RPC"
        session.handle({"type": "set_defaults", "defaults": {"framework": "rpc"}})
        assert store.value.framework == "rpc" and sent[-1]["defaults"]["framework"] == "rpc"
    session.handle({"type": "set_defaults", "defaults": {"framework": "horovod"}})
    session.handle({"type": "set_defaults", "defaults": {"framework": "rpc"}})  # uninstalled again
    assert sent[-1]["type"] == "error" and "framework must be one of" in sent[-1]["message"]
    assert store.value.framework == "horovod"


def test_values_must_be_sent_as_the_kernel_sends_them(hub, store):
    session, sent = greeted(hub)
    session.handle({"type": "set_defaults", "defaults": {"backend": "NCCL"}})
    assert sent[-1]["message"] == "backend: send 'nccl', not 'NCCL'"
    session.handle({"type": "set_defaults", "defaults": {"nodes": 0}})
    assert sent[-1]["message"] == "nodes must be a whole number from 1 to 4096, not 0"
    assert store.value == RunDefaults()


def test_minor_version_difference_is_accepted(hub):
    sent: list[dict[str, Any]] = []
    comm.SidebarSession(hub, sent.append).handle({"type": "hello", "version": "1.7"})  # type: ignore[arg-type]
    assert sent[0]["type"] == "welcome"


@pytest.mark.parametrize("version", ["0.9", "2.0"])
def test_other_major_version_is_a_mismatch(version, hub):
    sent: list[dict[str, Any]] = []
    session = comm.SidebarSession(hub, sent.append)  # type: ignore[arg-type]
    session.handle({"type": "hello", "version": version})
    assert sent == [
        {"type": "error", "code": "version_mismatch", "message": sent[0]["message"]},
    ]
    assert "version mismatch" in sent[0]["message"]
    session.handle({"type": "get_state"})
    assert sent[-1]["code"] == "no_hello"


def test_requests_before_hello_are_refused(hub):
    sent: list[dict[str, Any]] = []
    comm.SidebarSession(hub, sent.append).handle({"type": "get_state"})  # type: ignore[arg-type]
    assert sent[0]["type"] == "error" and sent[0]["code"] == "no_hello"


# ---------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "data",
    [
        None,
        "get_state",
        ["hello"],
        {},
        {"type": "exec", "code": "import os"},
        {"type": "__import__('os').system('id')"},
        {"type": 3},
        {"type": "get_state", "extra": 1},
        {"type": "hello", "version": 1.0},
        {"type": "hello", "version": "one"},
        {"type": "cluster"},
        {"type": "cluster", "action": "destroy"},
        {"type": "cluster", "action": ["start"]},
        {"type": "set_defaults"},
        {"type": "set_defaults", "defaults": []},
        {"type": "set_defaults", "defaults": {"color": "red"}},
        {"type": "set_defaults", "defaults": {"framework": "rpc"}},
        {"type": "set_defaults", "defaults": {"framework": 1}},
        {"type": "set_defaults", "defaults": {"nodes": "2"}},
        {"type": "set_defaults", "defaults": {"nodes": 0}},
        {"type": "set_defaults", "defaults": {"nodes": True}},
        {"type": "set_defaults", "defaults": {"nodes": 2.0}},
        {"type": "set_defaults", "defaults": {"procs_per_node": -1}},
        {"type": "set_defaults", "defaults": {"backend": "NCCL"}},
        {"type": "set_defaults", "defaults": {"launcher": "pbs"}},
        {"type": "set_defaults", "defaults": {"ib": "yes"}},
        {"type": "set_defaults", "defaults": {"timeout": 0}},
        {"type": "set_defaults", "defaults": {"timeout": "10"}},
        {"type": "set_defaults", "defaults": {"timeout": float("inf")}},
        {"type": "set_defaults", "defaults": {"hosts": "node1,node2"}},
        {"type": "set_defaults", "defaults": {"hosts": [1]}},
    ],
)
def test_invalid_messages_are_refused_and_logged(data, caplog, hub, store):
    session, sent = greeted(hub)
    with caplog.at_level("WARNING", logger="jupyter_dist.ui.sidebar"):
        session.handle(data)
    assert len(sent) == 1 and sent[0]["type"] == "error" and sent[0]["code"] == "bad_message"
    assert sent[0]["message"]
    assert "refused sidebar message" in caplog.text
    assert store.value == RunDefaults()


@pytest.mark.parametrize(
    "host",
    [
        "node1; rm -rf /",
        "$(id)",
        "`id`",
        "a|b",
        "a&&b",
        "node 1",
        "-oProxyCommand=sh",
        "node1\n",
        "256.1.1.1",
        "1.2.3",
        "::g",
        "a" * 64,
        "",
        "node_1",
    ],
)
def test_hosts_with_shell_metacharacters_or_bad_syntax_are_refused(host, hub, store):
    session, sent = greeted(hub)
    session.handle({"type": "set_defaults", "defaults": {"hosts": ["ok-node", host]}})
    assert sent[-1]["type"] == "error"
    assert "hosts" in sent[-1]["message"]
    assert store.value.hosts == ()


@pytest.mark.parametrize(
    "host", ["node1", "gpu-07.cluster.local", "10.0.0.12", "::1", "fe80::1:2", "localhost"]
)
def test_good_hosts_are_accepted(host, hub, store):
    assert validate.is_host(host)
    session, sent = greeted(hub)
    session.handle({"type": "set_defaults", "defaults": {"hosts": [host]}})
    assert store.value.hosts == (host,)


def test_long_values_are_not_echoed_whole(hub):
    session, sent = greeted(hub)
    session.handle({"type": "x" * 10_000})
    assert len(sent[0]["message"]) < 100


# ---------------------------------------------------------------------------- the store


def test_set_defaults_changes_the_store_and_pushes_state(hub, store):
    session, sent = greeted(hub)
    hub.add_session("a", session)
    hub.follow_store()
    session.handle(
        {
            "type": "set_defaults",
            "defaults": {
                "framework": "mpi",
                "nodes": 2,
                "procs_per_node": 4,
                "hosts": ["n1", "10.0.0.2"],
                "timeout": 30,
            },
        }
    )
    value = store.value
    assert (value.framework, value.nodes, value.procs_per_node, value.hosts, value.timeout) == (
        "mpi",
        2,
        4,
        ("n1", "10.0.0.2"),
        30.0,
    )
    assert [m["type"] for m in sent] == ["state"]
    assert sent[0]["defaults"]["hosts"] == ["n1", "10.0.0.2"]


def test_unchanged_set_defaults_still_answers(hub):
    session, sent = greeted(hub)
    hub.add_session("a", session)
    hub.follow_store()
    session.handle({"type": "set_defaults", "defaults": {"framework": "pytorch"}})
    assert [m["type"] for m in sent] == ["state"]


def test_store_changes_push_state_to_every_greeted_session(hub, store):
    one, sent_one = greeted(hub)
    two, sent_two = greeted(hub)
    silent: list[dict[str, Any]] = []
    hub.add_session("one", one)
    hub.add_session("two", two)
    hub.add_session("silent", comm.SidebarSession(hub, silent.append))  # type: ignore[arg-type]
    hub.follow_store()
    hub.follow_store()  # idempotent: one push per change
    store.update(nodes=3)
    assert [m["defaults"]["nodes"] for m in sent_one] == [3]
    assert [m["defaults"]["nodes"] for m in sent_two] == [3]
    assert silent == []
    hub.drop_session("two")
    store.update(nodes=4)
    assert len(sent_two) == 1 and len(sent_one) == 2


# ---------------------------------------------------------------------------- the cluster


def test_status_and_actions_come_from_the_cluster_control(hub):
    session, sent = greeted(hub)
    hub.add_session("a", session)
    ctrl = FakeControl()
    hub.set_control(ctrl)
    assert sent[-1]["status"]["engines"] == 4  # setting the control pushes
    session.handle({"type": "cluster", "action": "start"})
    assert ctrl.calls == ["start"] and sent[-1]["type"] == "state"
    session.handle({"type": "cluster", "action": "restart"})
    assert sent[-1]["type"] == "error" and sent[-1]["code"] == "action_failed"
    assert "engines would not come up" in sent[-1]["message"]
    ctrl.current = {**ctrl.current, "state": "busy"}
    hub.notify_status()
    assert sent[-1]["status"]["state"] == "busy"


def test_actions_without_a_cluster_control_are_refused(hub):
    session, sent = greeted(hub)
    session.handle({"type": "cluster", "action": "stop"})
    assert sent[-1]["code"] == "action_failed"


def test_a_failing_status_is_reported_not_raised(hub):
    class Broken(FakeControl):
        def status(self) -> dict[str, Any]:
            raise OSError("gone")

    hub.set_control(Broken())
    status = hub.cluster_status()
    assert status["state"] == "error" and "gone" in status["message"]


def test_the_core_status_is_normalized_to_the_protocol_shape():
    raw = {
        "state": "idle",
        "engines": 4,
        "expected": 4,
        "launcher": "mpi",
        "hosts": [],
        "framework": "pytorch",
        "nodes": 2,
        "procs_per_node": 2,
        "ranks": [
            {"rank": r, "engine_id": 7 - r, "pid": 100 + r, "host": "h", "state": "idle"} for r in range(4)
        ]
        + [{"rank": "x"}, "junk", {"rank": 4, "node": 9, "local_rank": 0, "host": None, "state": "zombie"}],
    }
    status = comm.normalize_status(raw)
    assert set(status) == {"state", "engines", "expected", "framework", "nodes", "procs_per_node", "ranks"}
    assert [(r["rank"], r["node"], r["local_rank"]) for r in status["ranks"]] == [
        (0, 0, 0),
        (1, 0, 1),
        (2, 1, 0),
        (3, 1, 1),
        (4, 9, 0),
    ]
    assert set(status["ranks"][0]) == {"rank", "node", "local_rank", "host", "state"}
    assert status["ranks"][4]["state"] == "dead" and status["ranks"][4]["host"] == ""
    assert comm.normalize_status({"state": "weird"})["state"] == "error"


def test_other_threads_get_the_snapshot_and_never_call_the_control(hub):
    ctrl = FakeControl()
    hub.set_control(ctrl)  # takes a snapshot on this (main) thread
    calls: list[str] = []
    ctrl.status = lambda: (
        calls.append("status") or {"state": "busy", "engines": 0, "expected": 0, "ranks": []}
    )
    seen: list[Any] = []
    worker = threading.Thread(target=lambda: seen.append(hub.cluster_status()))
    worker.start()
    worker.join()
    assert seen[0]["engines"] == 4 and calls == []
    hub.notify_status()  # no sidebar connected: nothing reads a status, none is taken
    assert calls == []
    session, sent = greeted(hub)
    hub.add_session("a", session)
    calls.clear()
    hub.notify_status()  # the core's thread refreshes the snapshot, once, and pushes it
    assert calls == ["status"] and sent[-1]["status"]["state"] == "busy"


# ---------------------------------------------------------------------------- registration


def test_register_without_a_kernel_does_nothing(hub):
    assert comm.register(None) is None
    assert comm.register(SimpleNamespace(), hub) is None
    from IPython.testing.globalipapp import get_ipython

    assert comm.register(get_ipython()) is None  # the test shell every module shares


class FakeComm:
    def __init__(self) -> None:
        self.comm_id = "c1"
        self.sent: list[dict[str, Any]] = []
        self.on_msg_cb: Any = None
        self.on_close_cb: Any = None
        self._reply_subshell_for = lambda data, default: "somewhere-else"

    def send(self, data: dict[str, Any]) -> None:
        self.sent.append(data)

    def on_msg(self, cb: Any) -> None:
        self.on_msg_cb = cb

    def on_close(self, cb: Any) -> None:
        self.on_close_cb = cb


def test_register_with_a_kernel_opens_sessions_per_comm(hub, store):
    targets: dict[str, Any] = {}
    manager = SimpleNamespace(register_target=targets.__setitem__)
    assert comm.register(SimpleNamespace(kernel=SimpleNamespace(comm_manager=manager)), hub) is hub
    fake = FakeComm()
    targets[comm.TARGET_NAME](fake, {"content": {"data": {"type": "hello", "version": "1.0"}}})
    assert [m["type"] for m in fake.sent] == ["welcome", "state"]
    assert fake._reply_subshell_for(None, "mine") == "mine"  # routed by the request's subshell
    fake.on_msg_cb({"content": {"data": {"type": "set_defaults", "defaults": {"nodes": 2}}}})
    assert fake.sent[-1]["defaults"]["nodes"] == 2
    fake.on_close_cb({})
    store.update(nodes=5)
    assert fake.sent[-1]["defaults"]["nodes"] == 2


# ---------------------------------------------------------------------------- a real kernel


CONTROL_IN_KERNEL = """
import threading
class Ctrl:
    threads = []
    def status(self):
        return {"state": "stopped", "engines": 0, "expected": 0, "ranks": []}
    def start(self):
        self.threads.append(threading.current_thread().name)
    stop = restart = start
ctrl = Ctrl()
hub.set_control(ctrl)
"""


def test_sidebar_comm_over_a_subshell_answers_while_the_main_shell_is_busy():
    """ipykernel 7: a comm opened with a subshell_id header is served by that subshell's thread."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", cwd=str(Path(__file__).parents[2]))
    try:
        features = kc.kernel_info(reply=True, timeout=30)["content"].get("supported_features", [])
        if "kernel subshells" not in features:
            pytest.skip("this ipykernel has no subshells")
        kc.control_channel.send(kc.session.msg("create_subshell_request", {}))
        subshell_id = kc.control_channel.get_msg(timeout=10)["content"]["subshell_id"]
        reply = kc.execute_interactive(
            "from jupyter_dist.ui import sidebar as comm; hub = comm.register(get_ipython())", timeout=30
        )
        assert reply["content"]["status"] == "ok"
        comm_id = uuid.uuid4().hex

        def send(msg_type: str, content: dict[str, Any]) -> None:
            msg = kc.session.msg(msg_type, content)
            msg["header"]["subshell_id"] = subshell_id
            kc.shell_channel.send(msg)

        def replies(count: int, within: float) -> list[str]:
            got: list[str] = []
            deadline = time.monotonic() + within
            while len(got) < count and time.monotonic() < deadline:
                try:
                    msg = kc.iopub_channel.get_msg(timeout=0.1)
                except Exception:
                    continue
                if msg["msg_type"] == "comm_msg" and msg["content"]["comm_id"] == comm_id:
                    got.append(msg["content"]["data"]["type"])
            return got

        # the comm opens while the main shell is busy
        kc.execute("import time; time.sleep(3)")
        time.sleep(0.5)
        hello = {"type": "hello", "version": "1.0"}
        send("comm_open", {"comm_id": comm_id, "target_name": "jupyter_dist", "data": hello})
        assert replies(2, 2.0) == ["welcome", "state"]
        kc.get_shell_msg(timeout=10)  # the sleep's execute_reply
        # the main shell pushes a state (as a running %%distrun does), then stays busy
        kc.execute("hub.notify_status(); time.sleep(6)")
        assert replies(1, 2.0) == ["state"]
        send("comm_msg", {"comm_id": comm_id, "data": {"type": "get_state"}})
        assert replies(1, 2.0) == ["state"]  # answered while the main shell sleeps
        kc.get_shell_msg(timeout=10)
        # a cluster action from the subshell runs on the main thread, which owns the cluster
        reply = kc.execute_interactive(CONTROL_IN_KERNEL, timeout=30)
        assert reply["content"]["status"] == "ok"
        replies(1, 1.0)  # the push from set_control
        send("comm_msg", {"comm_id": comm_id, "data": {"type": "cluster", "action": "start"}})
        assert replies(1, 5.0) == ["state"]
        threads: list[str] = []
        kc.execute_interactive(
            "print(ctrl.threads)",
            timeout=30,
            output_hook=lambda m: (
                threads.append(m["content"].get("text", "")) if m["msg_type"] == "stream" else None
            ),
        )
        assert "MainThread" in "".join(threads)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
