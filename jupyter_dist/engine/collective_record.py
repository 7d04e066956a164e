"""A light record of this process's torch.distributed collectives: the one in flight, the last completed.

Installed on every rank at set-up (engine/collectives.py) and in every worker process a rank's
engine starts (--fresh's child, torchrun's workers: engine/worker_collectives.py); it wraps
`torch.distributed`'s collective functions when that module is imported, whenever that is
(engine/frameworks/patch.py). Each call made from the cell (not the nested ones torch makes inside
another collective) gets a sequence number per process group (counted from the cell's start, or the
worker's), its op name, the tensors' sizes and dtype and its start time, in memory only (a few
microseconds a call; nothing is written); `snapshot` is what is in flight and the last completed
ones. The notebook compares ranks by sequence number (run/desync.py): a rank in another op, or one
that never reached the collective.
DDP's gradient all-reduces run in C++ and are not seen here; the cell's own collectives are.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from types import CodeType, ModuleType
from typing import Any

from jupyter_dist.engine.frameworks.patch import when_imported, wrap_torch_distributed
from jupyter_dist.engine.resources import observing

MARK = "_jupyter_dist_record"  # on a wrapped collective: wrapped once
OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "gather", "scatter",
       "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier",
       "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list", "send", "recv")
KEEP = 8  # completed collectives kept

_lock = threading.Lock()
_local = threading.local()
_state: dict[str, Any] = {"seq": {}, "in_flight": {}, "done": deque(maxlen=KEEP), "on": True}


def install() -> None:
    """Record torch.distributed's collectives from now on (once; now or when torch.distributed loads)."""
    when_imported("torch.distributed", _wrap_module)


def _wrap_module(dist: ModuleType) -> None:
    wrap_torch_distributed(dist, OPS, _recorded, MARK)


def _recorded(op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def collective(*args: Any, **kwargs: Any) -> Any:
        if getattr(_local, "depth", 0) or not _state["on"]:  # torch's nested call (all_gather_object ->
            return fn(*args, **kwargs)                           # all_gather), or JUPYTER_DIST_OBSERVE=0
        record = _begin(op, args, kwargs)
        _local.depth = 1
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:  # a collective that failed (timed out, aborted) is over, not in flight
            record["error"] = type(e).__name__
            _end(record)
            raise
        finally:
            _local.depth = 0
        if kwargs.get("async_op") and result is not None:
            _finish_when_done(record, result)
        else:
            _end(record)
        return result

    # its frame named as the op (stacks read "all_reduce at <cell>:9", not this wrapper's name)
    collective.__code__ = _named(collective.__code__, op)
    setattr(collective, MARK, True)
    collective.__wrapped__ = fn  # type: ignore[attr-defined]
    collective.__name__ = getattr(fn, "__name__", op)
    collective.__doc__ = fn.__doc__
    return collective


def _named(code: CodeType, name: str) -> CodeType:
    if hasattr(code, "co_qualname"):  # Python 3.11+: py-spy and tracebacks read the qualified name
        return code.replace(co_name=name, co_qualname=name)
    return code.replace(co_name=name)


def _begin(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    key = _group_key(kwargs.get("group"))
    tensors = _tensors(args, kwargs)
    with _lock:
        seq = _state["seq"].get(key, 0) + 1
        _state["seq"][key] = seq
        record = {"op": op, "seq": seq, "group": key, "start": time.time(), "tensors": tensors,
                  "thread": threading.get_ident()}
        _state["in_flight"][id(record)] = record
    return record


def _group_key(group: Any) -> str:
    """The same on every member rank: 'default', or the group's global ranks ('ranks 0,2')."""
    if group is None:
        return "default"
    try:
        import torch.distributed as dist  # loaded already: this runs inside one of its collectives

        if group is dist.group.WORLD:
            return "default"
        return "ranks " + ",".join(str(r) for r in dist.get_process_group_ranks(group))
    except Exception:  # noqa: BLE001 - a group torch cannot describe: this rank's own name for it
        return f"group {id(group):x}"


def _end(record: dict[str, Any]) -> None:
    with _lock:
        if _state["in_flight"].pop(id(record), None) is not None:
            record["end"] = time.time()
            _state["done"].append(record)


def _finish_when_done(record: dict[str, Any], work: Any) -> None:
    """An async collective stays in flight until its work completes (checked when asked)."""
    record["work"] = work


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[list[Any]]:
    """[[shape, dtype], ...] of the tensors among the first arguments (lists of tensors flattened)."""
    found: list[list[Any]] = []
    for value in (*args[:2], kwargs.get("tensor"), kwargs.get("tensor_list"), kwargs.get("output_tensor")):
        for item in value if isinstance(value, (list, tuple)) else (value,):
            shape = getattr(item, "shape", None)
            if shape is not None and hasattr(item, "dtype"):
                found.append([list(shape), str(item.dtype).removeprefix("torch.")])
            if len(found) >= 4:
                return found
    return found


def snapshot(_: dict[str, Any] | None = None) -> dict[str, Any]:
    """The agent's "collectives": {"in_flight": [...], "done": [...], "now": t}, oldest first."""
    with _lock:
        for key, record in list(_state["in_flight"].items()):
            work = record.get("work")
            if work is not None and _completed(work):
                del _state["in_flight"][key]
                record["end"] = time.time()
                _state["done"].append(record)
        in_flight = sorted(_state["in_flight"].values(), key=lambda r: r["start"])
        done = list(_state["done"])
    return {"in_flight": [_public(r) for r in in_flight], "done": [_public(r) for r in done], "now": time.time()}


def _completed(work: Any) -> bool:
    try:
        return bool(work.is_completed())
    except Exception:  # noqa: BLE001 - a work object of another kind: assume done
        return True


def _public(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in ("work", "thread")}


def reset(_cell: str = "") -> None:
    """Forget the record: numbers count from each cell's start, alike on every rank of the run.
    The run's JUPYTER_DIST_OBSERVE=0 (resources.SWITCH) turns the record off for it."""
    with _lock:
        _state["on"] = observing()
        _state["seq"].clear()
        _state["in_flight"].clear()
        _state["done"].clear()

