"""A script's `destroy_process_group()` in a warm engine keeps the default group (script mode).

Scripts written for torchrun end with `dist.destroy_process_group()`, and so do Accelerate's
`end_training()` and DeepSpeed's. In a process that then exits this is harmless. In a warm engine
the script's objects are freed after it (a DDP model as `main()` returns), and the next run makes a
new group: freeing a DDP model whose group was destroyed, while the next group forms, hangs in
torch's own teardown (docs/reliability.md; here 1 run in 2 with 4 ranks on 2 cores). So while a
script runs, a destroy of the default group is recorded, not done: its objects are freed with the
group alive, and the next run's `init_process_group` for the same world is handed the same group
(engine.torch_hooks' idempotent init). Only where that idempotent init is installed (the torch
frameworks); elsewhere the destroy is done as asked.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from jupyter_dist.engine.frameworks.patch import when_imported

_state: dict[str, Any] = {"running": False, "kept": 0}


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """While the script runs, `destroy_process_group()` of the default group keeps it."""
    when_imported("torch.distributed", _patch)
    _state["running"] = True
    try:
        yield
    finally:
        _state["running"] = False


def kept_count() -> int:
    """How many destroys of the default group were kept (for tests)."""
    return int(_state["kept"])


def _patch(dist: ModuleType) -> None:
    if getattr(dist.destroy_process_group, "_jupyter_dist_keep", False):
        return
    original = dist.destroy_process_group

    def destroy_process_group(group: Any = None) -> None:
        idempotent = getattr(dist.init_process_group, "_jupyter_dist", False)
        if group is None and _state["running"] and idempotent and dist.is_initialized():
            _state["kept"] += 1
            return None
        return original(group)

    destroy_process_group._jupyter_dist_keep = True  # type: ignore[attr-defined]
    destroy_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    destroy_process_group.__doc__ = original.__doc__
    dist.destroy_process_group = destroy_process_group
    c10d = getattr(dist, "distributed_c10d", None)
    if c10d is not None and getattr(c10d, "destroy_process_group", None) is original:
        c10d.destroy_process_group = destroy_process_group
