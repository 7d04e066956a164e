"""torch on a warm engine: process groups that survive re-run cells, GPU binding, thread count.

torch is imported only by the hooks that need it; the rest look in `sys.modules`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from jupyter_dist.common.channel import GROUP_GONE
from jupyter_dist.engine.cells import BEFORE_CELL, END_OF_CELL, add_hook

# the world of the group this engine's init_process_group made: (backend, size, rank, addr, port, init);
# broken: a release (engine/release.py) shut the group's sockets, it is destroyed on the main thread
_state: dict[str, Any] = {"world": None, "broken": False}


def cuda_set_device() -> None:
    """NCCL: bind this rank to GPU LOCAL_RANK before any process group exists."""
    import torch  # heavy, and only for NCCL runs

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def sync_torch_threads() -> None:
    """OMP_NUM_THREADS is read once at torch import; a warm engine needs it applied by hand."""
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS")
    if torch is not None and threads and threads.isdigit():
        torch.set_num_threads(int(threads))


def torch_idempotent_init() -> None:
    """Make `init_process_group` a no-op when a group of the same world already exists.

    A cell written for torchrun calls it unconditionally; re-running that cell on warm
    engines must not fail. A different world (size, rank, master) replaces the old group.
    """
    import torch.distributed as dist  # heavy: torch frameworks only

    if getattr(dist.init_process_group, "_jupyter_dist", False):
        return
    original = dist.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = with_default_backend(args, kwargs)
        want = _wanted_world(args, kwargs)
        if dist.is_initialized():
            if _state["world"] == want:
                return None
            # the real one: a script's destroy is kept while it runs (engine.script_group)
            getattr(dist.destroy_process_group, "__wrapped__", dist.destroy_process_group)()
        if want[0] == "nccl" or os.environ.get("JUPYTER_DIST_BACKEND") == "nccl":
            cuda_set_device()
        result = original(*args, **kwargs)
        _state["world"] = want
        return result

    init_process_group._jupyter_dist = True  # type: ignore[attr-defined]
    init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    init_process_group.__doc__ = original.__doc__
    dist.init_process_group = init_process_group
    add_hook(END_OF_CELL, torch_group_gone)
    add_hook(BEFORE_CELL, destroy_broken_group)


def with_default_backend(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`--backend` (JUPYTER_DIST_BACKEND) as the backend of an `init_process_group()` that names
    none; a backend the cell names wins. torch alone would make a group whose backend is "undefined"."""
    chosen = os.environ.get("JUPYTER_DIST_BACKEND", "")
    if args or kwargs.get("backend") is not None or chosen in ("", "auto"):
        return args, kwargs
    return args, {**kwargs, "backend": chosen}


def mark_group_broken() -> None:
    """The group's sockets were shut (from the agent's thread): the main thread destroys it next."""
    _state["broken"] = True
    forget_world()


def _destroy_if_broken() -> bool:
    if not _state["broken"]:
        return False
    _state["broken"] = False
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    forget_world()
    return True


def destroy_broken_group(code: str = "") -> None:
    """Before a cell: a group released while no cell ran is destroyed before the cell can use it."""
    _destroy_if_broken()


def torch_group_gone() -> tuple[str, Any] | None:
    """End-of-cell hook: tell the notebook when the cell destroyed the group it had made.

    A cell written for torchrun ends with `destroy_process_group()`. Run again on the same
    warm engines with the same MASTER_PORT, the new group's first collective hung (see
    docs/reliability.md); with a new port it does not. The notebook takes a new master port
    for the next run when it gets `GROUP_GONE`.
    """
    if _destroy_if_broken():
        return GROUP_GONE, True
    if _state["world"] is None:
        return None
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return None
    forget_world()
    return GROUP_GONE, True


def forget_world() -> None:
    """The group this engine made is gone (destroyed here or by a fault handler)."""
    _state["world"] = None


def _wanted_world(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    backend = kwargs.get("backend", args[0] if args else None)
    env = os.environ
    return (
        str(backend).lower() if backend is not None else None,
        kwargs.get("world_size", env.get("WORLD_SIZE")),
        kwargs.get("rank", env.get("RANK")),
        env.get("MASTER_ADDR"),
        env.get("MASTER_PORT"),
        kwargs.get("init_method"),
    )
