"""Around each cell on an engine: hooks before and after it, and the value a `%%distrun` cell shows.

Before every cell the namespace gets jupyter-dist's entry (`__jupyter_dist__`, engine.entry),
through which the cell code the notebook writes reaches the engine.

`%%distrun` sends its cells `silent` (ipyparallel's own default for `execute`): an engine then
sends no `execute_input` message for the cell, and the wait for a warm 4-rank cell's replies is
about 1.4 ms shorter (benchmarks/dispatch_phases.py). IPython runs a silent cell without its `pre_run_cell` and
`post_run_cell` events and without showing the last expression's value, so the hooks here ride
on `pre_execute`/`post_execute` (fired for every cell) and fire those two events for a
`%%distrun` cell (so a user's hooks on the engines, `%autoreload` among them, see it as a cell),
and an AST transformer shows the value of a `%%distrun` cell's last expression through the
display hook, as IPython would have: `Out` on the rank, `_`, and nothing after a trailing `;`.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable
from typing import Any

from IPython import get_ipython
from IPython.core.interactiveshell import ExecutionInfo

from jupyter_dist.engine import entry
from jupyter_dist.engine.publish import publish
from jupyter_dist.engine.show import ends_in_semicolon

# ipyparallel's request label on the cells %%distrun sends: tells its cells from %%px's
CELL_LABEL = "jupyter-dist"

# Run on every rank before each cell, given the cell's code (the request's text).
BEFORE_CELL: list[Callable[[str], None]] = []
# Run on every rank after each cell; each returns (key, data) to send back (publish), or None.
END_OF_CELL: list[Callable[[], tuple[str, Any] | None]] = []

_state: dict[str, Any] = {"watching": False, "code": "", "show_value": False, "ours": False, "running": False}


def cell_running() -> bool:
    """Whether a cell runs now (between its pre_execute and post_execute)."""
    return bool(_state["running"])


def distrun_cell() -> bool:
    """Whether the running cell is one %%distrun sent (not a `%px` cell of the user's)."""
    return bool(_state["running"] and _state["ours"])


def add_hook(hooks: list[Any], fn: Any) -> None:
    """Add `fn` to `hooks` unless a function of that name from the same module is there (a module
    imported again, say after a reload, brings a new function object)."""
    if not any(getattr(h, "__qualname__", "") == fn.__qualname__ and getattr(h, "__module__", "") == fn.__module__
               for h in hooks):
        hooks.append(fn)


# `__jupyter_dist__.show_value(<expr>)`: the name is bound before every cell (entry.bind)
_SHOW = ast.parse(entry.call_code(entry.ENTRY.show_value, None), mode="eval").body


def watch(shell: Any) -> None:
    """Hook `shell`'s cells (once per engine)."""
    if _state["watching"] or shell is None:
        return
    shell.events.register("pre_execute", _before_cell)
    shell.events.register("post_execute", _after_cell)
    shell.ast_transformers.append(ShowLastValue())
    entry.bind(shell.user_ns)
    _state["watching"] = True


def request(shell: Any) -> tuple[str, bool]:
    """The running cell's code, and whether %%distrun sent it silent (so shows its value here)."""
    kernel = getattr(shell, "kernel", None)
    parent = kernel.get_parent("shell") if kernel is not None else None
    if not parent:
        return "", False
    content = parent.get("content") or {}
    ours = (parent.get("metadata") or {}).get("label") == CELL_LABEL and bool(content.get("silent"))
    return content.get("code", ""), ours


def _before_cell() -> None:
    shell = get_ipython()
    entry.bind(shell.user_ns)
    code, ours = request(shell)
    _state["code"], _state["show_value"], _state["ours"] = code, ours, ours
    _state["running"] = True
    for hook in BEFORE_CELL:
        hook(code)
    if ours:
        shell.events.trigger("pre_run_cell", run_info(code))


def _after_cell() -> None:
    ours, _state["show_value"], _state["ours"] = _state["ours"], False, False
    _state["running"] = False
    for hook in END_OF_CELL:
        item = hook()
        if item is not None:
            publish(*item)
    if ours:
        shell = get_ipython()
        shell.events.trigger("post_run_cell", shell.last_execution_result)


def run_info(code: str) -> Any:
    """The `ExecutionInfo` IPython would give `pre_run_cell` for this cell had it been sent loud."""
    return ExecutionInfo(code, store_history=False, silent=False, shell_futures=True, cell_id=None)


class ShowLastValue(ast.NodeTransformer):
    """Wraps a %%distrun cell's last expression statement in `show_value(...)`.

    Only the first module transformed after the cell starts: a cell magic (`%%time`) that
    transforms its body again leaves the body as it is, and shows the value as it would.
    """

    def visit_Module(self, node: ast.Module) -> ast.Module:
        if not _state["show_value"]:
            return node
        _state["show_value"] = False
        last = node.body[-1] if node.body else None
        if not isinstance(last, ast.Expr) or ends_in_semicolon(_state["code"]):
            return node
        call = ast.Call(func=_at(copy.deepcopy(_SHOW.func), last.value), args=[last.value], keywords=[])
        node.body[-1] = ast.copy_location(ast.Expr(value=ast.copy_location(call, last.value)), last)
        return node


def _at(tree: ast.AST, where: ast.AST) -> ast.AST:
    """`tree` with every node placed at `where`: a traceback points at the user's expression."""
    for sub in ast.walk(tree):
        ast.copy_location(sub, where)
    return tree
