"""Does the cell compile? Asked before anything runs on the ranks, so a typo never touches them."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from IPython.core.error import UsageError


def check_compiles(code: str, shell: Any = None) -> None:
    """A cell that does not compile fails here, before anything runs on the ranks."""
    source = code
    if shell is not None:
        source = _transformed(shell, code)
    problem = compile_problem(source)
    if problem:
        raise UsageError(problem)


_last_transform: tuple[Any, str, str] | None = None


def _transformed(shell: Any, code: str) -> str:
    """IPython's transform of the cell, kept for the last cell (re-runs of a cell pay it once)."""
    global _last_transform
    last = _last_transform
    if last is not None and last[0] is shell and last[1] == code:
        return last[2]
    source = shell.transform_cell(code)
    _last_transform = (shell, code, source)
    return source


@lru_cache(maxsize=16)
def compile_problem(source: str) -> str | None:
    """The sentence for a source that does not compile, else None (cached: cells are re-run as they are)."""
    try:
        compile(source, "<distrun cell>", "exec")
    except SyntaxError as e:
        return f"the cell does not compile: line {e.lineno}: {e.msg}."
    return None
