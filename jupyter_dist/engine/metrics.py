"""Metrics on a rank: `report()`, its batches, and the hooks that send them.

`report()` appends one tuple to a list; now and then (checked by the call itself)
the batch goes to the notebook through `engine.publish`, a display message that travels with
the rank's output: no round trip. What is left is sent at the end of every cell by an
`engine_cells.END_OF_CELL` hook. The gap between flushes starts at `FLUSH_FIRST_S` (the chart
shows up at once) and doubles to `FLUSH_MAX_S`: the engine's IOPub thread sends a display
message, and to do so takes the GIL from the training loop (about 3 more waits of a rank's main
thread per flush, benchmarks/README.md); the controller and the notebook handle every batch of
every rank, which adds up with many ranks. For torch, a global optimizer step hook counts steps
when the cell calls no `report()`. Outside jupyter-dist (say, an exported script under plain
torchrun) `report()` stays a cheap no-op.

The notebook gathers the batches in `jupyter_dist.run.metrics_store.MetricsStore`.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from itertools import repeat
from typing import Any

# Where no kernel carries display messages (a torchrun worker under jupyter-dist), a batch is
# one stdout line with LINE_PREFIX; the notebook's sinks take it out of the rank's output.
from jupyter_dist.common.channel import METRICS as KEY
from jupyter_dist.common.channel import METRICS_LINE_PREFIX as LINE_PREFIX

FLUSH_FIRST_S = 0.5
FLUSH_MAX_S = 2.0

_now = time.time  # wall clock: ranks and notebook share it (within NTP) for the time axis

# -- rank side -------------------------------------------------------------------------

_rows: list[tuple[Any, ...]] = []  # (t, step, samples, tokens, scalars)
_NO_SCALARS: dict[str, float] = {}  # shared, never written: a call with no scalars
_auto: list[float] = []  # times of optimizer steps, while the cell calls no report()
_next_flush = 0.0  # 0 until the cell's first record: that one only schedules the first flush
_flush_gap = FLUSH_FIRST_S  # until the next flush; doubles after each, to FLUSH_MAX_S
_reported = False  # report() was called in this cell
_state: dict[str, Any] = {"auto_opt": None, "torch_hook": None, "sender": None, "watching": False,
                          "atexit": False, "depth": 0, "counts": {}, "others": {}}


def report(step: int | None = None, samples: int | None = None, tokens: int | None = None,
           **scalars: float) -> None:
    """Record one point: `samples`/`tokens` done since the last call, and scalars (loss=...).

    Cheap (a tuple appended; see benchmarks/report_cost.py); the batch is sent 0.5 s after the
    cell's first record, 1 s later, then every 2 s, and at the end of the cell. Tensors are turned
    into floats here, which waits for the device: pass `float(loss)` where that matters.
    """
    global _reported
    t = _now()
    _reported = True
    if scalars:
        for k, v in scalars.items():
            if v.__class__ is not float:
                scalars[k] = _as_float(k, v)
        _rows.append((t, step, samples, tokens, scalars))
    else:
        _rows.append((t, step, samples, tokens, _NO_SCALARS))
    if t >= _next_flush:
        _due(t)


def _as_float(name: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"jupyter_dist.report({name}=...) needs a number, not {type(value).__name__}") from None


def _due(t: float) -> None:
    """The slow path: the cell's first record (set-up only), or a flush that is due."""
    global _next_flush, _flush_gap
    if _next_flush == 0.0:
        _watch()
        _flush_gap = FLUSH_FIRST_S
    else:
        flush()
        _flush_gap = min(_flush_gap * 2, FLUSH_MAX_S)
    _next_flush = t + _flush_gap


def _before_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """torch's global pre-step hook: a step inside a step (a wrapper's `step` calling its base
    class's, as Horovod's DistributedOptimizer does) is not counted again."""
    _state["depth"] += 1


def _on_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """torch's global post-step hook: one step of the optimizer the cell trains with, unless
    report() is used. That is the one that has stepped most in this cell (the first on a tie): a
    script may step another first (Horovod's `broadcast_optimizer_state` steps the optimizer it
    later wraps) or step two (a GAN's, counted as one)."""
    _state["depth"] = depth = max(_state["depth"] - 1, 0)
    if depth or _reported:
        return
    oid = id(optimizer)
    counts = _state["counts"]
    n = counts[oid] = counts.get(oid, 0) + 1
    t = _now()
    lead = _state["auto_opt"]
    if lead is None:
        _state["auto_opt"] = lead = oid
    if oid == lead:
        _auto.append(t)
    else:
        others = _state["others"]
        others.setdefault(oid, []).append(t)
        if n <= counts[lead]:
            return
        others[lead] = _auto[:]  # the one stepped most leads from now on
        _auto[:] = others.pop(oid)
        _state["auto_opt"] = oid
    if t >= _next_flush:
        _due(t)


def take() -> dict[str, Any] | None:
    """The pending batch as a JSON-able payload (columns), or None; the buffers are emptied."""
    n, m = len(_rows), len(_auto)
    rows, auto = _rows[:n], _auto[:m]
    del _rows[:n], _auto[:m]
    _state["others"].clear()
    if _reported:
        auto = []
    if not rows and not auto:
        return None
    payload: dict[str, Any] = {"v": 1}
    if rows:
        t, step, samples, tokens, scalars = zip(*rows, strict=True)
        k = -(-len(rows) // MAX_ROWS)  # records merged into one, past MAX_ROWS
        payload["t"] = _last(t, k)
        for name, col, merge in (("step", step, _last), ("samples", samples, _sum), ("tokens", tokens, _sum)):
            if col.count(None) < len(col):
                payload[name] = merge(col, k)
        names = _names(scalars)
        if names:
            payload["scalars"] = {n: _mean(list(map(dict.get, scalars, repeat(n))), k) for n in names}
    if auto:
        payload["auto_t"] = auto
    return payload


def _names(scalars: tuple[dict[str, float], ...]) -> list[str]:
    """Scalar names in the order first seen (C-speed for the usual: the same names every call)."""
    first = next((sc for sc in scalars if sc), None)
    if first is None:
        return []
    names = list(first)
    rest = set().union(*scalars).difference(names)
    return names + sorted(rest)


# A batch holds at most MAX_ROWS records: past that (thousands of calls a second) consecutive
# records are merged, units summed, scalars averaged, time and step those of the last, so
# rates stay exact and the flush costs the same whatever the call rate.
MAX_ROWS = 1000


def _chunks(col: tuple[Any, ...] | list[Any], k: int) -> list[Any]:
    return [col[i:i + k] for i in range(0, len(col), k)]


def _last(col: tuple[Any, ...], k: int) -> list[Any]:
    if k == 1:
        return list(col)
    out = []
    for chunk in _chunks(col, k):
        vals = [v for v in chunk if v is not None] if None in chunk else chunk
        out.append(vals[-1] if vals else None)
    return out


def _sum(col: tuple[Any, ...], k: int) -> list[Any]:
    if k == 1:
        return list(col)
    out = []
    for chunk in _chunks(col, k):
        if None in chunk:
            vals = [v for v in chunk if v is not None]
            out.append(sum(vals) if vals else None)
        else:
            out.append(sum(chunk))
    return out


def _mean(col: list[Any], k: int) -> list[Any]:
    if k == 1:
        return col
    out = []
    for chunk in _chunks(col, k):
        vals = [v for v in chunk if v is not None] if None in chunk else chunk
        out.append(math.fsum(vals) / len(vals) if vals else None)
    return out


def flush() -> None:
    """Send what is pending now (also what the end-of-cell hook does, via its return value)."""
    payload = take()
    if payload is not None:
        _sender()(payload)


def _sender() -> Any:
    sender = _state["sender"]
    if sender is None:
        sender = _state["sender"] = _pick_sender()
    return sender


def _pick_sender() -> Any:
    engine = sys.modules.get("jupyter_dist.engine.setup")
    if engine is not None and engine._state.get("rank") is not None:
        return lambda payload: engine.publish(KEY, payload)
    if os.environ.get("JUPYTER_DIST_FRAMEWORK"):  # a worker process of a jupyter-dist run
        if not _state["atexit"]:
            import atexit

            atexit.register(flush)
            _state["atexit"] = True
        return _print_line
    return lambda payload: None


def _print_line(payload: dict[str, Any]) -> None:
    sys.stdout.write(LINE_PREFIX + json.dumps(payload, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def end_of_cell() -> tuple[str, dict[str, Any]] | None:
    """`engine_cells.END_OF_CELL` hook: the cell's last batch, and a fresh start for the next cell."""
    payload = take()
    new_cell()
    return (KEY, payload) if payload is not None else None


def _watch() -> None:
    """Once: outside an engine, flush at exit (an engine flushes at the end of each cell, by the
    hook `metrics_hooks.install` adds)."""
    if not _state["watching"]:
        _sender()
        _state["watching"] = True


def watching() -> None:
    """The end of each cell flushes (an engine's `metrics_hooks.install` hooked it)."""
    _state["watching"] = True


def new_cell() -> None:
    """A fresh start for the next cell: no flush scheduled, no report() yet, no optimizer chosen."""
    global _next_flush, _reported
    _next_flush, _reported = 0.0, False
    _state["auto_opt"], _state["depth"] = None, 0
    _state["counts"], _state["others"] = {}, {}


def torch_hooked() -> bool:
    return _state["torch_hook"] is not None


def hook_torch(load: bool = False) -> bool:
    """Register the global optimizer step hooks once; import torch.optim only when `load`."""
    if _state["torch_hook"] is not None:
        return True
    if "torch" not in sys.modules and not load:
        return False
    try:
        from torch.optim.optimizer import (  # heavy, optional
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )
    except ImportError:
        return False
    _state["torch_hook"] = Hooks(register_optimizer_step_pre_hook(_before_optimizer_step),
                                 register_optimizer_step_post_hook(_on_optimizer_step))
    return True


class Hooks:
    """The step hooks' handles, removed together."""

    def __init__(self, *handles: Any) -> None:
        self.handles = handles

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
