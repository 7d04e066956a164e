"""The one store of run defaults shared by `%%distrun`, the panel and the sidebar.

A `%%distrun` without a flag takes the value from here; a run with explicit flags
writes them back. The panel and the sidebar read and write the same store and
subscribe to its changes, so there is never a second copy to drift.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cache
from importlib.metadata import entry_points
from typing import Any

FRAMEWORKS: tuple[str, ...] = (
    "pytorch",
    "torchrun",
    "mpi",
    "horovod",
    "deepspeed",
    "lightning",
    "huggingface",
    "tensorflow",
)
BACKENDS: tuple[str, ...] = ("auto", "nccl", "gloo", "mpi")
LAUNCHERS: tuple[str, ...] = ("mpi", "local", "ssh", "slurm")
IB_MODES: tuple[str, ...] = ("auto", "on", "off")
LAUNCHER_ENTRY_POINTS = "jupyter_dist.launchers"


@cache
def launcher_names() -> tuple[str, ...]:
    """What `--launcher` accepts: the built-in launchers, then those a package adds through the
    `jupyter_dist.launchers` entry point group. Only the names are read here; the classes are loaded
    by `cluster.launchers`, which sits above the plan."""
    added = [ep.name for ep in entry_points(group=LAUNCHER_ENTRY_POINTS) if ep.name not in LAUNCHERS]
    return LAUNCHERS + tuple(dict.fromkeys(added))


@dataclass(frozen=True)
class RunDefaults:
    """Values a flag-less `%%distrun` uses. `procs_per_node=None` means "GPUs per node, else 2"."""

    framework: str = "pytorch"
    nodes: int = 1
    procs_per_node: int | None = None
    backend: str = "auto"
    launcher: str | None = None  # None: mpi when mpiexec is found, else local
    hosts: tuple[str, ...] = ()
    ib: str = "auto"
    timeout: float | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["hosts"] = list(self.hosts)
        return data


DEFAULT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RunDefaults))

Listener = Callable[[RunDefaults], None]


@dataclass
class DefaultsStore:
    """Thread-safe holder of the current `RunDefaults` with change listeners."""

    _value: RunDefaults = field(default_factory=RunDefaults)
    _listeners: list[Listener] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def value(self) -> RunDefaults:
        return self._value

    def update(self, **changes: Any) -> RunDefaults:
        """Set some fields (unknown names are a programming error) and notify listeners."""
        unknown = set(changes) - set(DEFAULT_FIELDS)
        if unknown:
            raise KeyError(f"unknown default(s): {', '.join(sorted(unknown))}")
        if "hosts" in changes and changes["hosts"] is not None:
            changes["hosts"] = tuple(changes["hosts"])
        with self._lock:
            new = replace(self._value, **changes)
            if new == self._value:
                return new
            self._value = new
            listeners = list(self._listeners)
        for listener in listeners:
            listener(new)
        return new

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` on every change; returns a function that unsubscribes."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def reset(self) -> None:
        self.update(**asdict(RunDefaults()))


STORE = DefaultsStore()
