"""What the panel and the sidebar show and drive: each run default's choices and check, the cluster control.

The `%%distrun` flags check their values with `jupyter_dist.plan.validate`; the panel's controls
and the sidebar's `set_defaults` check theirs here, field by field, with the same functions, so a
value one accepts the others accept too. The frameworks offered are the registry's: one added
through the `jupyter_dist.frameworks` entry point group can be chosen everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from jupyter_dist import frameworks
from jupyter_dist.plan import validate
from jupyter_dist.plan.defaults import BACKENDS, DEFAULT_FIELDS, IB_MODES, launcher_names

CLUSTER_ACTIONS: tuple[str, ...] = ("start", "stop", "restart")


class ClusterControl(Protocol):
    """What the core provides to the panel and the sidebar: the cluster's status and its lifecycle."""

    def status(self) -> dict[str, Any]: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def restart(self) -> None: ...


def stopped_status() -> dict[str, Any]:
    """The status shown while there is no cluster (a new dict each time: callers may change it)."""
    return {"state": "stopped", "engines": 0, "expected": 0, "ranks": []}


def framework_choices() -> list[tuple[str, str]]:
    """(name, title) of every registered framework, in the registry's order."""
    return [(name, fw.title or name) for name, fw in frameworks.registry().items()]


Check = Callable[[Any, str], Any]


def _one_of(choices: Callable[[], Iterable[str]]) -> Check:
    return lambda value, name: validate.choice(value, name, choices())


_CHECKS: dict[str, Check] = {
    "framework": _one_of(frameworks.registry),  # read at each check: entry points load lazily
    "nodes": lambda value, name: validate.count(value, name, limit=validate.MAX_NODES),
    "procs_per_node": lambda value, name: validate.count(value, name, limit=validate.MAX_PROCS_PER_NODE),
    "backend": _one_of(lambda: BACKENDS),
    "launcher": _one_of(launcher_names),
    "hosts": validate.hosts,
    "ib": _one_of(lambda: IB_MODES),
    "timeout": validate.timeout,
}
# None means "automatic" here: GPUs per node else 2, mpi when mpiexec is found else local, no timeout
NULLABLE = frozenset({"procs_per_node", "launcher", "timeout"})
assert set(_CHECKS) == set(DEFAULT_FIELDS), "every RunDefaults field needs a check"


def check_defaults(changes: Mapping[str, Any]) -> dict[str, Any]:
    """The clean values of some run defaults, ready for `DefaultsStore.update`; raises `InvalidValue`
    naming the first bad one (by its `RunDefaults` field name)."""
    unknown = [key for key in changes if key not in _CHECKS]
    if unknown:
        raise validate.InvalidValue(f"defaults: unknown field(s) {', '.join(validate.shown(k) for k in unknown)}")
    return {
        key: None if value is None and key in NULLABLE else _CHECKS[key](value, key)
        for key, value in changes.items()
    }
