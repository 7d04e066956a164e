"""The sidebar's wire format: the typed messages, the check of every incoming one, the replies.

Frontend -> kernel: `hello` (the comm's open data), `get_state`, `set_defaults`, `cluster`, `stacks`.
Kernel -> frontend: `welcome` (the protocol version and the choices: frameworks from the
registry with their titles, backends, launchers, IB modes, actions), `state` (the run defaults
and the cluster status), `stacks` (every rank's stack and collective, as `%dist stacks` prints
them) and `error`. Anything that is not one of these messages, exactly, is a
`ProtocolError`; nothing a frontend sends is ever evaluated.

Version 1.1 added `framework_titles` to `welcome`; a 1.0 frontend ignores it. Version 1.2 added
the `stacks` request and reply (the sidebar's Stacks button); a 1.1 frontend never sends it.
"""

from __future__ import annotations

import re
from typing import Any, Literal, TypedDict, cast

from jupyter_dist.plan import validate
from jupyter_dist.plan.defaults import BACKENDS, IB_MODES, RunDefaults, launcher_names
from jupyter_dist.views.controls import CLUSTER_ACTIONS, check_defaults, framework_choices, stopped_status

PROTOCOL_VERSION = "1.2"
TARGET_NAME = "jupyter_dist"
CLUSTER_STATES: tuple[str, ...] = ("stopped", "starting", "idle", "busy", "error")
RANK_STATES: tuple[str, ...] = ("idle", "busy", "dead", "starting")

ClusterAction = Literal["start", "stop", "restart"]
ErrorCode = Literal["bad_message", "version_mismatch", "no_hello", "action_failed"]


# ---------------------------------------------------------------------------- frontend -> kernel


class HelloMsg(TypedDict):
    type: Literal["hello"]
    version: str


class GetStateMsg(TypedDict):
    type: Literal["get_state"]


class SetDefaultsMsg(TypedDict):
    type: Literal["set_defaults"]
    defaults: dict[str, Any]  # a checked subset of RunDefaults fields


class ClusterMsg(TypedDict):
    type: Literal["cluster"]
    action: ClusterAction


class StacksMsg(TypedDict):
    type: Literal["stacks"]


Request = HelloMsg | GetStateMsg | SetDefaultsMsg | ClusterMsg | StacksMsg


# ---------------------------------------------------------------------------- kernel -> frontend


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
    frameworks: list[str]  # the registry's names, in its order
    framework_titles: dict[str, str]  # name -> what the sidebar shows
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


class StacksReplyMsg(TypedDict):
    type: Literal["stacks"]
    text: str  # what `%dist stacks` prints: the collectives each rank is in, then the stacks grouped


Reply = WelcomeMsg | StateMsg | StacksReplyMsg | ErrorMsg

STOPPED_STATUS = cast(ClusterStatus, stopped_status())


# ---------------------------------------------------------------------------- checks


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
    "stacks": frozenset({"type"}),
}
_VERSION = re.compile(r"\d{1,4}\.\d{1,4}")
_show = validate.shown


def major(version: str) -> str:
    return version.split(".", 1)[0]


def parse_defaults(value: object) -> dict[str, Any]:
    """Check a `set_defaults` payload; returns the changes ready for `DefaultsStore.update`.

    Each value gets the check the flags and the panel use (`views.controls.check_defaults`), and
    must already be what that check returns: the sidebar sends values as the kernel sent them
    (`'nccl'`, `2`, a list of host names), so text that only reads as one (`'NCCL'`, `'2'`,
    `'node1,node2'`, `'node1\\n'`) is refused rather than read.
    """
    if not isinstance(value, dict):
        raise ProtocolError("defaults must be an object")
    try:
        clean = check_defaults(value)
    except validate.InvalidValue as e:
        raise ProtocolError(str(e)) from None
    for key, item in clean.items():
        wire = list(item) if isinstance(item, tuple) else item
        if wire != value[key]:
            raise ProtocolError(f"{key}: send {_show(wire)}, not {_show(value[key])}")
    return clean


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
    if kind == "stacks":
        return StacksMsg(type="stacks")
    return GetStateMsg(type="get_state")


# ---------------------------------------------------------------------------- replies


def welcome() -> WelcomeMsg:
    choices = framework_choices()
    return WelcomeMsg(
        type="welcome",
        version=PROTOCOL_VERSION,
        frameworks=[name for name, _title in choices],
        framework_titles=dict(choices),
        backends=list(BACKENDS),
        launchers=list(launcher_names()),
        ib_modes=list(IB_MODES),
        actions=list(CLUSTER_ACTIONS),
        factory_defaults=RunDefaults().to_json(),
    )


def state(defaults: RunDefaults, status: ClusterStatus) -> StateMsg:
    return StateMsg(type="state", defaults=defaults.to_json(), status=status)


def stacks(text: str) -> StacksReplyMsg:
    return StacksReplyMsg(type="stacks", text=text)


def error(message: str, code: ErrorCode = "bad_message") -> ErrorMsg:
    return ErrorMsg(type="error", code=code, message=message)
