"""Releasing a rank from a hung cell, from the agent's thread (the cell holds the main thread).

The agent op "release" does two things a `--timeout` or an interrupt needs:

- it cuts this rank's torch process group loose: the group's peer sockets are shut, so every rank
  waiting with it in a collective (gloo) fails at once with "connection closed by peer" instead of
  waiting out the group's 30-minute timeout; the group is marked broken, and it is destroyed on the
  main thread at the end of the cell, so the next `init_process_group` makes a fresh one;
- with `interrupt`, it raises `KeyboardInterrupt` in the main thread by a signal sent to that thread
  only (`pthread_kill`), with a signal of our own (SIGUSR2): a cell that blocked or ignored SIGINT
  is stopped too, and a sleep, a lock or a read the main thread waits in returns at once.

A main thread that holds the GIL in native code lets neither the agent nor the signal's handler run;
the notebook then reports its native stack (py-spy) and replaces the rank's engine.
"""

from __future__ import annotations

import importlib
import signal
import sys
import threading
from typing import Any

from jupyter_dist.engine import agent, cells
from jupyter_dist.engine.faults import shut_peer_sockets
from jupyter_dist.engine.torch_hooks import mark_group_broken

STOP_SIGNAL = signal.SIGUSR2
_state: dict[str, Any] = {"armed": False}


def arm() -> None:
    """Main thread: STOP_SIGNAL raises KeyboardInterrupt while a cell runs (ignored between cells)."""
    if _state["armed"] or threading.current_thread() is not threading.main_thread():
        return
    signal.signal(STOP_SIGNAL, _on_stop)
    _state["armed"] = True


def _on_stop(signum: int, frame: Any) -> None:
    if cells.cell_running():
        raise KeyboardInterrupt(f"jupyter-dist stopped this rank's cell (signal {signum})")


def release(args: dict[str, Any]) -> dict[str, Any]:
    """Agent op: cut the torch group loose (args["protected_ports"]: the controller's, never cut) and,
    with args["interrupt"], stop the running cell."""
    dist = sys.modules.get("torch.distributed")
    had_group = bool(dist is not None and dist.is_available() and dist.is_initialized())
    shut = 0
    if had_group:
        mark_group_broken()
        keep_local = {agent.listening_port()}
        shut = shut_peer_sockets(set(args.get("protected_ports") or ()), keep_local)
    stopped = False
    if args.get("interrupt") and cells.cell_running() and _state["armed"]:
        signal.pthread_kill(threading.main_thread().ident or 0, STOP_SIGNAL)
        stopped = True
    return {"group": had_group, "shut": shut, "interrupted": stopped}


# heavy modules a replacement engine imports before it is needed, when the rank it replaces had them
PRELOADABLE = ("torch.distributed", "numpy", "tensorflow", "transformers", "lightning", "deepspeed", "accelerate")


def loaded(_: dict[str, Any] | None = None) -> list[str]:
    """Agent op: which of PRELOADABLE this rank has imported (cluster/replacement.py asks a survivor)."""
    return [m for m in PRELOADABLE if m in sys.modules]


def preload(names: list[str]) -> list[str]:
    """Import these of PRELOADABLE now, on a spare engine (no rank yet), so that the rank it may replace
    finds them imported. Returns those it could not import."""
    failed = []
    for name in names:
        if name in PRELOADABLE and name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - a spare without it imports it in the cell, as a new engine would
                failed.append(name)
    return failed


def register() -> None:
    arm()
    agent.register("release", release)
    agent.register("loaded", loaded)
