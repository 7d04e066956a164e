"""The cell as a script sees it: plain Python (IPython's `!cmd` allowed, magics refused) and the
names it reads from earlier cells."""

from __future__ import annotations

import ast
import builtins
import symtable

from IPython.core.error import UsageError
from IPython.core.inputtransformer2 import TransformerManager

SHELL_CALLS = ("system", "getoutput")


def cell_source(code: str) -> tuple[str, bool]:
    """The cell as plain Python, and whether it needs the `!cmd` shim.

    IPython's own transform turns `!cmd` into `get_ipython().system(...)`; the script gets a tiny
    stand-in for those calls. Magics have no plain-Python form and are refused.
    """
    transformed = TransformerManager().transform_cell(code)
    tree = ast.parse(transformed)
    shell_used = False
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "get_ipython"):
            continue
        parent = _parent_call(tree, node)
        what = parent.func.attr if parent is not None else None  # type: ignore[union-attr]
        if what in SHELL_CALLS and parent is not None:
            arg = parent.args[0] if parent.args else None
            cmd = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None
            if cmd is None or "$" in cmd or "{" in cmd:
                raise UsageError(
                    f"%dist export: the shell escape on line {node.lineno} of the cell expands Python values "
                    "($name or {expr}), which a script cannot do: write it with subprocess, then re-run the cell."
                )
            shell_used = True
            continue
        name = _magic_name(parent)
        raise UsageError(
            f"%dist export: the cell uses {name} on line {node.lineno}, which has no plain-Python form "
            "in a script: remove it or write it in Python, then re-run the cell."
        )
    return (transformed if shell_used else code), shell_used


def _parent_call(tree: ast.AST, inner: ast.Call) -> ast.Call | None:
    """The call `get_ipython().X(...)` around `inner`, if that is what it is."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.value is inner):
            return node
    return None


def _magic_name(call: ast.Call | None) -> str:
    if call is None or not isinstance(call.func, ast.Attribute):
        return "get_ipython()"
    kind = {"run_line_magic": "%", "run_cell_magic": "%%"}.get(call.func.attr)
    arg = call.args[0] if call.args else None
    if kind and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return "IPython help (?)" if arg.value in ("pinfo", "pinfo2") else f"the IPython magic {kind}{arg.value}"
    return f"get_ipython().{call.func.attr}"


def free_names(source: str) -> list[str]:
    """Names the cell reads but never defines: on warm engines an earlier cell defined them."""
    try:
        top = symtable.symtable(source, "<cell>", "exec")
    except SyntaxError:
        return []
    defined: set[str] = set()
    used: set[str] = set()

    def walk(table: symtable.SymbolTable) -> None:
        for s in table.get_symbols():
            name = s.get_name()
            at_top = table is top or s.is_declared_global()
            if at_top and (s.is_assigned() or s.is_imported() or s.is_namespace()):
                defined.add(name)
            if s.is_referenced() and (table is top or s.is_global()):
                used.add(name)
        for child in table.get_children():
            walk(child)

    walk(top)
    known = set(dir(builtins)) | {"__file__", "__name__", "get_ipython"}
    return sorted(used - defined - known)

