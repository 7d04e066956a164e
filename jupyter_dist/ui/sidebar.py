"""The JupyterLab sidebar's comm protocol: typed messages, their validation, the kernel side.

The sidebar opens a comm to the target ``jupyter_dist`` with a ``hello`` as the open data. The
kernel answers ``welcome`` (protocol version and the allowed choices) and ``state`` (the run
defaults and the cluster status), and pushes a new ``state`` whenever the defaults store or the
cluster status changes. Every incoming message is checked against the protocol; anything else
is refused with an ``error`` reply and logged, never evaluated.

Comm handlers may run on a kernel subshell thread (the sidebar sends its traffic over a subshell
when the kernel supports them), so everything here is thread-safe and ``ClusterControl``
methods may be called from a thread other than the main one.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import re
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, Literal, Protocol, TypedDict

from jupyter_dist.plan.defaults import (
    BACKENDS,
    DEFAULT_FIELDS,
    FRAMEWORKS,
    IB_MODES,
    LAUNCHERS,
    STORE,
    RunDefaults,
)

PROTOCOL_VERSION = "1.0"
TARGET_NAME = "jupyter_dist"
CLUSTER_ACTIONS: tuple[str, ...] = ("start", "stop", "restart")
CLUSTER_STATES: tuple[str, ...] = ("stopped", "starting", "idle", "busy", "error")
RANK_STATES: tuple[str, ...] = ("idle", "busy", "dead", "starting")
MAX_NODES = 4096
MAX_PROCS_PER_NODE = 1024

log = logging.getLogger(__name__)

ClusterAction = Literal["start", "stop", "restart"]
ErrorCode = Literal["bad_message", "version_mismatch", "no_hello", "action_failed"]


# ---------------------------------------------------------------------------- wire types


class HelloMsg(TypedDict):
    type: Literal["hello"]
    version: str


class GetStateMsg(TypedDict):
    type: Literal["get_state"]


class SetDefaultsMsg(TypedDict):
    type: Literal["set_defaults"]
    defaults: dict[str, Any]  # a validated subset of RunDefaults fields


class ClusterMsg(TypedDict):
    type: Literal["cluster"]
    action: ClusterAction


Request = HelloMsg | GetStateMsg | SetDefaultsMsg | ClusterMsg


class RankStatus(TypedDict):
    rank: int
    node: int
    local_rank: int
    host: str
    state: Literal["idle", "busy", "dead", "starting"]


class _ClusterStatusRequired(TypedDict):
    state: Literal["stopped", "starting", "idle", "busy", "error"]
    engines: int
    expected: int
    ranks: list[RankStatus]


class ClusterStatus(_ClusterStatusRequired, total=False):
    framework: str | None
    nodes: int
    procs_per_node: int
    message: str  # what went wrong, with state "error"


class WelcomeMsg(TypedDict):
    type: Literal["welcome"]
    version: str
    frameworks: list[str]
    backends: list[str]
    launchers: list[str]
    ib_modes: list[str]
    actions: list[str]
    factory_defaults: dict[str, Any]


class StateMsg(TypedDict):
    type: Literal["state"]
    defaults: dict[str, Any]
    status: ClusterStatus


class ErrorMsg(TypedDict):
    type: Literal["error"]
    code: ErrorCode
    message: str


Reply = WelcomeMsg | StateMsg | ErrorMsg

STOPPED_STATUS: ClusterStatus = {"state": "stopped", "engines": 0, "expected": 0, "ranks": []}


class ClusterControl(Protocol):
    """What the core provides to the sidebar: the cluster's status and its lifecycle."""

    def status(self) -> dict[str, Any]: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def restart(self) -> None: ...


# ---------------------------------------------------------------------------- validation


class ProtocolError(ValueError):
    """An incoming message that does not follow the protocol."""

    def __init__(self, message: str, code: ErrorCode = "bad_message") -> None:
        super().__init__(message)
        self.code: ErrorCode = code


_REQUEST_FIELDS: dict[str, frozenset[str]] = {
    "hello": frozenset({"type", "version"}),
    "get_state": frozenset({"type"}),
    "set_defaults": frozenset({"type", "defaults"}),
    "cluster": frozenset({"type", "action"}),
}
_VERSION = re.compile(r"\d{1,4}\.\d{1,4}")
_HOST_NAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)
_IPV4 = re.compile(r"(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)")
_IPV6 = re.compile(r"[0-9A-Fa-f:.]{2,45}")


def _show(value: object) -> str:
    """A short, safe rendering of a client value for an error message or a log line."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def major(version: str) -> str:
    return version.split(".", 1)[0]


def is_host(value: str) -> bool:
    """A host name, an IPv4 or an IPv6 address; nothing a shell would interpret."""
    if _IPV4.fullmatch(value):
        return True
    if ":" in value and _IPV6.fullmatch(value):
        try:
            ipaddress.IPv6Address(value)
        except ValueError:
            return False
        return True
    # digits-and-dots only is a malformed IPv4, not a name
    return bool(_HOST_NAME.fullmatch(value)) and not re.fullmatch(r"[\d.]+", value)


def _choice(name: str, choices: tuple[str, ...], nullable: bool = False) -> Callable[[object], object]:
    def check(value: object) -> object:
        if value is None and nullable:
            return None
        if not isinstance(value, str) or value not in choices:
            raise ProtocolError(f"{name} must be one of {', '.join(choices)}; got {_show(value)}")
        return value

    return check


def _count(name: str, limit: int, nullable: bool = False) -> Callable[[object], object]:
    def check(value: object) -> object:
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise ProtocolError(f"{name} must be an integer from 1 to {limit}; got {_show(value)}")
        return value

    return check


def _hosts(value: object) -> object:
    if not isinstance(value, list) or len(value) > MAX_NODES:
        raise ProtocolError(f"hosts must be a list of at most {MAX_NODES} host names")
    for host in value:
        if not isinstance(host, str) or not is_host(host):
            raise ProtocolError(f"hosts: {_show(host)} is not a host name or IP address")
    return tuple(value)


def _timeout(value: object) -> object:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ProtocolError(f"timeout must be a positive number of seconds or null; got {_show(value)}")
    return float(value)


_DEFAULT_CHECKS: dict[str, Callable[[object], object]] = {
    "framework": _choice("framework", FRAMEWORKS),
    "nodes": _count("nodes", MAX_NODES),
    "procs_per_node": _count("procs_per_node", MAX_PROCS_PER_NODE, nullable=True),
    "backend": _choice("backend", BACKENDS),
    "launcher": _choice("launcher", LAUNCHERS, nullable=True),
    "hosts": _hosts,
    "ib": _choice("ib", IB_MODES),
    "timeout": _timeout,
}
assert set(_DEFAULT_CHECKS) == set(DEFAULT_FIELDS), "every RunDefaults field needs a check"


def parse_defaults(value: object) -> dict[str, Any]:
    """Validate a `set_defaults` payload; returns the changes ready for `STORE.update`."""
    if not isinstance(value, dict):
        raise ProtocolError("defaults must be an object")
    unknown = [key for key in value if key not in _DEFAULT_CHECKS]
    if unknown:
        raise ProtocolError(f"defaults: unknown field(s) {', '.join(_show(key) for key in unknown)}")
    return {key: _DEFAULT_CHECKS[key](item) for key, item in value.items()}


def parse_request(data: object) -> Request:
    """Check one frontend message against the protocol; raises `ProtocolError`."""
    if not isinstance(data, dict):
        raise ProtocolError("a message must be a JSON object")
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in _REQUEST_FIELDS:
        raise ProtocolError(f"unknown message type {_show(kind)}")
    keys = set(data)
    expected = _REQUEST_FIELDS[kind]
    if keys != expected:
        extra = ", ".join(_show(key) for key in sorted(keys - expected, key=str))
        missing = ", ".join(sorted(expected - keys))
        detail = "; ".join(
            part for part in (extra and f"extra {extra}", missing and f"missing {missing}") if part
        )
        raise ProtocolError(f"{kind}: {detail}")
    if kind == "hello":
        version = data["version"]
        if not isinstance(version, str) or not _VERSION.fullmatch(version):
            raise ProtocolError(f"hello: version must look like '1.0'; got {_show(version)}")
        return HelloMsg(type="hello", version=version)
    if kind == "set_defaults":
        return SetDefaultsMsg(type="set_defaults", defaults=parse_defaults(data["defaults"]))
    if kind == "cluster":
        action = data["action"]
        if not isinstance(action, str) or action not in CLUSTER_ACTIONS:
            raise ProtocolError(
                f"cluster: action must be one of {', '.join(CLUSTER_ACTIONS)}; got {_show(action)}"
            )
        return ClusterMsg(type="cluster", action=action)  # type: ignore[typeddict-item]
    return GetStateMsg(type="get_state")


# ---------------------------------------------------------------------------- replies


def welcome() -> WelcomeMsg:
    return WelcomeMsg(
        type="welcome",
        version=PROTOCOL_VERSION,
        frameworks=list(FRAMEWORKS),
        backends=list(BACKENDS),
        launchers=list(LAUNCHERS),
        ib_modes=list(IB_MODES),
        actions=list(CLUSTER_ACTIONS),
        factory_defaults=RunDefaults().to_json(),
    )


def error(message: str, code: ErrorCode = "bad_message") -> ErrorMsg:
    return ErrorMsg(type="error", code=code, message=message)


# ---------------------------------------------------------------------------- the cluster

_control: ClusterControl | None = None
_snapshot: ClusterStatus = dict(STOPPED_STATUS)  # type: ignore[assignment]
_snapshot_lock = threading.Lock()


def _run_directly(fn: Callable[[], None]) -> None:
    fn()


# How cluster actions reach the thread that owns the cluster; `register` points it at the
# kernel's main loop, so an action from a subshell runs on the main thread (after a running cell).
_on_main: Callable[[Callable[[], None]], None] = _run_directly


def set_cluster_control(ctrl: ClusterControl | None) -> None:
    """Called by the core: the object whose status and actions the sidebar shows and drives."""
    global _control
    _control = ctrl
    broadcast_state(refresh_status())


def _count_or(value: object, default: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return default


def normalize_status(raw: object) -> ClusterStatus:
    """The provider's status in the protocol's shape: known keys only, every rank placed on the grid."""
    if not isinstance(raw, dict):
        raise TypeError(f"status must be a dict, not {type(raw).__name__}")
    procs = _count_or(raw.get("procs_per_node"), 0)
    ranks: list[RankStatus] = []
    for item in raw.get("ranks") or []:
        rank = _count_or(item.get("rank"), -1) if isinstance(item, dict) else -1
        if rank < 0:
            continue
        node, local = divmod(rank, procs) if procs else (0, rank)
        rank_state = item.get("state")
        ranks.append(
            RankStatus(
                rank=rank,
                node=_count_or(item.get("node"), node),
                local_rank=_count_or(item.get("local_rank"), local),
                host=str(item.get("host") or ""),
                state=rank_state if rank_state in RANK_STATES else "dead",
            )
        )
    state = raw.get("state")
    status: ClusterStatus = {
        "state": state if state in CLUSTER_STATES else "error",  # type: ignore[typeddict-item]
        "engines": _count_or(raw.get("engines"), 0),
        "expected": _count_or(raw.get("expected"), 0),
        "ranks": ranks,
    }
    framework = raw.get("framework")
    if "framework" in raw and (framework is None or isinstance(framework, str)):
        status["framework"] = framework
    if "nodes" in raw:
        status["nodes"] = _count_or(raw.get("nodes"), 0)
    if procs:
        status["procs_per_node"] = procs
    if isinstance(raw.get("message"), str):
        status["message"] = raw["message"]
    return status


def refresh_status() -> ClusterStatus:
    """Ask the cluster control for its status, on the caller's thread, and keep it as the snapshot."""
    global _snapshot
    ctrl = _control
    status: ClusterStatus
    if ctrl is None:
        status = dict(STOPPED_STATUS)  # type: ignore[assignment]
    else:
        try:
            status = normalize_status(ctrl.status())
        except Exception as exc:
            log.exception("cluster status failed")
            status = {**STOPPED_STATUS, "state": "error", "message": f"cluster status failed: {exc}"}
    with _snapshot_lock:
        _snapshot = status
    return status


def cluster_status() -> ClusterStatus:
    """Fresh on the main thread; elsewhere (a subshell) the snapshot the last notify took, so
    that the cluster, driven from the main thread, is never touched from another one."""
    if threading.current_thread() is threading.main_thread():
        return refresh_status()
    with _snapshot_lock:
        return _snapshot


def state() -> StateMsg:
    return StateMsg(type="state", defaults=STORE.value.to_json(), status=cluster_status())


# ---------------------------------------------------------------------------- sessions

Send = Callable[[Reply], None]


class SidebarSession:
    """One frontend's conversation: hello first, then requests; replies go to `send`."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.greeted = False

    def send(self, message: Reply) -> None:
        try:
            self._send(message)
        except Exception:
            log.exception("could not send %s to the sidebar", message["type"])

    def handle(self, data: object) -> None:
        try:
            self._dispatch(parse_request(data))
        except ProtocolError as err:
            log.warning("refused sidebar message: %s", err)
            self.send(error(str(err), err.code))

    def _dispatch(self, msg: Request) -> None:
        if msg["type"] == "hello":
            if major(msg["version"]) != major(PROTOCOL_VERSION):
                self.greeted = False
                raise ProtocolError(
                    f"version mismatch: the kernel speaks protocol {PROTOCOL_VERSION}, "
                    f"the sidebar {msg['version']}; update jupyter-dist in both",
                    "version_mismatch",
                )
            self.greeted = True
            self.send(welcome())
            self.send(state())
            return
        if not self.greeted:
            raise ProtocolError("send a hello with a matching protocol version first", "no_hello")
        if msg["type"] == "set_defaults":
            before = STORE.value
            if STORE.update(**msg["defaults"]) == before:
                self.send(state())  # unchanged: no broadcast, so answer directly
        elif msg["type"] == "cluster":
            self._cluster(msg["action"])
        else:
            self.send(state())

    def _cluster(self, action: ClusterAction) -> None:
        ctrl = _control
        if ctrl is None:
            raise ProtocolError("no cluster yet: run a %%distrun cell first", "action_failed")

        def run() -> None:
            try:
                getattr(ctrl, action)()
            except Exception as exc:
                log.exception("cluster %s failed", action)
                self.send(error(f"cluster {action} failed: {exc}", "action_failed"))
                return
            refresh_status()
            self.send(state())

        _on_main(run)


_sessions: dict[str, SidebarSession] = {}
_sessions_lock = threading.Lock()
_unsubscribe: Callable[[], None] | None = None


def add_session(key: str, session: SidebarSession) -> None:
    with _sessions_lock:
        _sessions[key] = session


def drop_session(key: str) -> None:
    with _sessions_lock:
        _sessions.pop(key, None)


def broadcast_state(status: ClusterStatus | None = None) -> None:
    """Send the current state (with `status` where the caller just took it) to every greeted session."""
    with _sessions_lock:
        sessions = [s for s in _sessions.values() if s.greeted]
    if sessions:
        message = state() if status is None else StateMsg(type="state", defaults=STORE.value.to_json(), status=status)
        for session in sessions:
            session.send(message)


def notify_status() -> None:
    """Called by the core (on the thread that drives the cluster) whenever its status changes.

    With no sidebar connected nothing reads the status, so none is taken: a run's busy/idle
    changes then cost nothing. A sidebar that connects later gets a fresh one on the main
    thread, or the last snapshot (catching up at the next change) while a cell runs.
    """
    with _sessions_lock:
        listening = bool(_sessions)
    if not listening:
        return
    broadcast_state(refresh_status())


def subscribe_store() -> None:
    """Push a state on every change of the defaults store (once per process)."""
    global _unsubscribe
    if _unsubscribe is None:
        _unsubscribe = STORE.subscribe(lambda _value: broadcast_state())


# ---------------------------------------------------------------------------- the kernel side


def _pin_routing(comm: Any) -> None:
    # ipykernel 7 routes a comm_msg to the subshell of the last message this comm *sent*, so
    # a state pushed from the main shell (by a running %%distrun cell) would send the sidebar's
    # next request to the busy main shell. Route by the request's own subshell_id instead.
    if hasattr(comm, "_reply_subshell_for"):
        comm._reply_subshell_for = lambda _data, default: default


def _on_comm_open(comm: Any, open_msg: dict[str, Any]) -> None:
    _pin_routing(comm)
    key = str(comm.comm_id)
    session = SidebarSession(comm.send)
    add_session(key, session)
    comm.on_msg(lambda msg: session.handle(msg.get("content", {}).get("data")))
    comm.on_close(lambda _msg: drop_session(key))
    data = open_msg.get("content", {}).get("data")
    if data:
        session.handle(data)


def _call_on_loop(loop: Any, fn: Callable[[], None]) -> None:
    if threading.current_thread() is threading.main_thread():
        fn()
    else:
        loop.add_callback(fn)


def _announce() -> None:
    """Tell frontends already attached to this kernel that the target now exists."""
    try:
        import comm as comm_package

        announcement = comm_package.create_comm(target_name=TARGET_NAME, data=dict(welcome()))
        announcement.close()
    except Exception:
        log.debug("could not announce the sidebar target", exc_info=True)


def register(ipython: object | None) -> bool:
    """Register the comm target on the kernel behind `ipython`; False (and nothing done) without one."""
    global _on_main
    kernel = getattr(ipython, "kernel", None)
    manager = getattr(kernel, "comm_manager", None)
    if manager is None:
        return False
    manager.register_target(TARGET_NAME, _on_comm_open)
    loop = getattr(kernel, "io_loop", None)
    if loop is not None:
        _on_main = partial(_call_on_loop, loop)
    subscribe_store()
    _announce()
    return True
