"""What a run reads from ipyparallel's per-rank results once they are done (no widgets, no I/O)."""

from __future__ import annotations

from typing import Any


def child_error(child: Any) -> BaseException | None:
    """ipyparallel resolves a failed execute with the error as its *result*."""
    exc = child.exception()
    if exc is None:
        res = child.result()
        exc = res if isinstance(res, BaseException) else None
    return exc


def child_result(child: Any) -> dict[str, Any] | None:
    """The value a rank's cell showed (`Out:`), if it showed one."""
    return child.output.metadata.get("execute_result")
