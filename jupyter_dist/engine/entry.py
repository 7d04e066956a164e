"""What code run as a cell on a rank calls into: one object, bound in every engine's user namespace.

The notebook runs some of jupyter-dist's own work as cell code, not as an `apply`, so that it
behaves as a cell: its output streams, its traceback is rendered, the display hook shows its
value. Script mode (`run_script_mode`: engine.script_run, a launcher's contract on a warm engine), a node's torchrun agent (`run_torchrun`) and the value a
`%%distrun` cell shows (`show_value`, inserted by engine.cells) reach the engine through
`NAME`, which `bind` puts in the namespace before every cell. The notebook writes such code
with `call_code`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jupyter_dist.engine import script_run
from jupyter_dist.engine.frameworks import torchrun_agent
from jupyter_dist.engine.script import run_script
from jupyter_dist.engine.show import show_value

NAME = "__jupyter_dist__"  # reserved in the engines' user namespace


class Entry:
    """The engine functions a cell's code may call, as `__jupyter_dist__.<name>(...)`."""

    run_script = staticmethod(run_script)
    run_script_mode = staticmethod(script_run.run)
    run_torchrun = staticmethod(torchrun_agent.run)
    show_value = staticmethod(show_value)

    def __repr__(self) -> str:
        return f"<jupyter-dist's entry for cell code ({NAME})>"


ENTRY = Entry()


def bind(namespace: dict[str, Any]) -> None:
    """Put ENTRY in `namespace` (again after a `%reset`)."""
    if namespace.get(NAME) is not ENTRY:
        namespace[NAME] = ENTRY


def call_code(fn: Callable[..., Any], *args: Any) -> str:
    """Cell code that calls `fn`, one of ENTRY's functions, with `args` (each written as its repr)."""
    for name, member in vars(Entry).items():
        if isinstance(member, staticmethod) and member.__func__ is fn:
            return f"{NAME}.{name}({', '.join(repr(a) for a in args)})"
    raise ValueError(f"{fn!r} is not reached through {NAME}")
