"""`input()` and `sys.stdin` in every `%%distrun` cell as in a script (engine.script_input): rank 0
asks the notebook, the other ranks get EOF. Not in the user's own `%px` cells, whose requests no run
loop answers."""

from __future__ import annotations

import contextlib

from jupyter_dist.engine import cells, script_input

_cell: dict[str, contextlib.ExitStack] = {}


def before_cell(_code: str) -> None:
    end_of_cell()
    if cells.distrun_cell():
        stack = contextlib.ExitStack()
        stack.enter_context(script_input.asking_notebook())
        _cell["stack"] = stack


def end_of_cell() -> None:
    """Put back the engine's own `input` and `sys.stdin` (ipykernel then restores its own)."""
    stack = _cell.pop("stack", None)
    if stack is not None:
        stack.close()


def register() -> None:
    cells.add_hook(cells.BEFORE_CELL, before_cell)
    cells.add_hook(cells.END_OF_CELL, end_of_cell)
