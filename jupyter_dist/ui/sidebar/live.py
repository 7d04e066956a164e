"""The sidebar's live side in the kernel: its open conversations, the cluster control, the status.

One `Sidebar` per kernel (made by `%load_ext`) holds the defaults store it shows, the cluster
control it drives, the open `SidebarSession`s (one per frontend comm) and the last status taken.
Comm handlers may run on a kernel subshell thread, so everything here is thread-safe, and the
cluster, driven from the main thread, is only touched there: a subshell reads the snapshot the
last status change took, and a cluster action is handed to `on_main`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from jupyter_dist.plan.defaults import DefaultsStore
from jupyter_dist.ui.sidebar.protocol import (
    CLUSTER_STATES,
    PROTOCOL_VERSION,
    RANK_STATES,
    STOPPED_STATUS,
    ClusterAction,
    ClusterStatus,
    ProtocolError,
    RankStatus,
    Reply,
    Request,
    StateMsg,
    error,
    major,
    parse_request,
    stacks,
    state,
    welcome,
)
from jupyter_dist.views.controls import ClusterControl

log = logging.getLogger(__name__)

Send = Callable[[Reply], None]
OnMain = Callable[[Callable[[], None]], None]


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
    cluster_state = raw.get("state")
    status: ClusterStatus = {
        "state": cluster_state if cluster_state in CLUSTER_STATES else "error",  # type: ignore[typeddict-item]
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


def run_directly(fn: Callable[[], None]) -> None:
    fn()


class Sidebar:
    """This kernel's side of every open sidebar: the store it shows, the cluster it drives."""

    def __init__(self, store: DefaultsStore, control: ClusterControl | None = None) -> None:
        self.store = store
        self.control = control
        # How cluster actions reach the thread that owns the cluster; `register` points it at the
        # kernel's main loop, so an action from a subshell runs on the main thread (after a running cell).
        self.on_main: OnMain = run_directly
        self._lock = threading.Lock()  # the sessions and the snapshot
        self._sessions: dict[str, SidebarSession] = {}
        self._snapshot: ClusterStatus = dict(STOPPED_STATUS)  # type: ignore[assignment]
        self._unfollow: Callable[[], None] | None = None

    # -- what it shows and drives ------------------------------------------------------

    def attach(self, store: DefaultsStore, control: ClusterControl | None) -> None:
        """Show `store` and drive `control` from now on (a session's, at each `%load_ext`)."""
        if store is not self.store:
            following = self._unfollow is not None
            self.unfollow_store()
            self.store = store
            if following:
                self.follow_store()
        self.set_control(control)

    def set_control(self, control: ClusterControl | None) -> None:
        """The object whose status and actions the sidebar shows and drives; pushes a new state."""
        self.control = control
        self.broadcast_state(self.refresh_status())

    def follow_store(self) -> None:
        """Push a state on every change of the defaults store (once, however often it is called)."""
        if self._unfollow is None:
            self._unfollow = self.store.subscribe(lambda _value: self.broadcast_state())

    def unfollow_store(self) -> None:
        if self._unfollow is not None:
            self._unfollow()
            self._unfollow = None

    # -- the cluster's status ----------------------------------------------------------

    def refresh_status(self) -> ClusterStatus:
        """Ask the cluster control for its status, on the caller's thread, and keep it as the snapshot."""
        control = self.control
        status: ClusterStatus
        if control is None:
            status = dict(STOPPED_STATUS)  # type: ignore[assignment]
        else:
            try:
                status = normalize_status(control.status())
            except Exception as exc:
                log.exception("cluster status failed")
                status = {**STOPPED_STATUS, "state": "error", "message": f"cluster status failed: {exc}"}
        with self._lock:
            self._snapshot = status
        return status

    def cluster_status(self) -> ClusterStatus:
        """Fresh on the main thread; elsewhere (a subshell) the snapshot the last notify took, so
        that the cluster, driven from the main thread, is never touched from another one."""
        if threading.current_thread() is threading.main_thread():
            return self.refresh_status()
        with self._lock:
            return self._snapshot

    def current_state(self, status: ClusterStatus | None = None) -> StateMsg:
        """The `state` message: the store's defaults and `status` (the cluster's now, when None)."""
        return state(self.store.value, self.cluster_status() if status is None else status)

    def notify_status(self) -> None:
        """Called by the core (on the thread that drives the cluster) whenever its status changes.

        With no sidebar connected nothing reads the status, so none is taken: a run's busy/idle
        changes then cost nothing. A sidebar that connects later gets a fresh one on the main
        thread, or the last snapshot (catching up at the next change) while a cell runs.
        """
        with self._lock:
            listening = bool(self._sessions)
        if listening:
            self.broadcast_state(self.refresh_status())

    # -- the conversations -------------------------------------------------------------

    def add_session(self, key: str, session: SidebarSession) -> None:
        with self._lock:
            self._sessions[key] = session

    def drop_session(self, key: str) -> None:
        with self._lock:
            self._sessions.pop(key, None)

    def broadcast_state(self, status: ClusterStatus | None = None) -> None:
        """Send the current state (with `status` where the caller just took it) to every greeted session."""
        with self._lock:
            sessions = [s for s in self._sessions.values() if s.greeted]
        if sessions:
            message = self.current_state(status)
            for session in sessions:
                session.send(message)


class SidebarSession:
    """One frontend's conversation: hello first, then requests; replies go to `send`."""

    def __init__(self, sidebar: Sidebar, send: Send) -> None:
        self.sidebar = sidebar
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
            self.send(self.sidebar.current_state())
            return
        if not self.greeted:
            raise ProtocolError("send a hello with a matching protocol version first", "no_hello")
        if msg["type"] == "set_defaults":
            store = self.sidebar.store
            before = store.value
            if store.update(**msg["defaults"]) == before:
                self.send(self.sidebar.current_state())  # unchanged: no broadcast, so answer directly
        elif msg["type"] == "cluster":
            self._cluster(msg["action"])
        elif msg["type"] == "stacks":
            self._stacks()
        else:
            self.send(self.sidebar.current_state())

    def _stacks(self) -> None:
        """Answered on this thread (a subshell while a cell runs): it asks the ranks' agents only."""
        take = getattr(self.sidebar.control, "stacks", None)
        if take is None:
            raise ProtocolError("no cluster yet: run a %%distrun cell first", "action_failed")
        try:
            text = take()
        except Exception as exc:
            log.exception("stacks failed")
            raise ProtocolError(f"stacks failed: {exc}", "action_failed") from None
        self.send(stacks(text))

    def _cluster(self, action: ClusterAction) -> None:
        control = self.sidebar.control
        if control is None:
            raise ProtocolError("no cluster yet: run a %%distrun cell first", "action_failed")

        def run() -> None:
            try:
                getattr(control, action)()
            except Exception as exc:
                log.exception("cluster %s failed", action)
                self.send(error(f"cluster {action} failed: {exc}", "action_failed"))
                return
            self.send(self.sidebar.current_state(self.sidebar.refresh_status()))

        self.sidebar.on_main(run)

