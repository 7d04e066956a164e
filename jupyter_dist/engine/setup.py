"""Set-up of a rank's engine: who it is, its rank, its environment and the framework's hooks.

Functions here are sent by reference (`view.apply(setup.setup, ...)`), so they must stay
importable and cheap to import: torch and friends are imported only by the hooks that need them.
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from IPython import get_ipython

from jupyter_dist.common.channel import EXIT, ExitData
from jupyter_dist.common.hosts import source_address
from jupyter_dist.engine import (
    agent,
    cell_input,
    cells,
    collectives,
    crash_records,
    flood_signal,
    gloo_loop,
    release,
    resources,
    stacks,
)
from jupyter_dist.engine.faults import arm_stack_files
from jupyter_dist.engine.publish import publish
from jupyter_dist.engine.sessions import own_session
from jupyter_dist.engine.torch_hooks import sync_torch_threads

_MISSING = object()
FLUSH_INTERVAL_S = 0.02  # what a rank printed is sent within this (ipykernel: 0.2 s)
FLUSH_SENT_WAIT_S = 1.0  # the longest an explicit flush waits for its message to be handed to zmq

# rank given by the notebook side; environment keys this package manages and their originals
_state: dict[str, Any] = {"rank": None, "saved": {}}


def identify() -> dict[str, Any]:
    """Who this engine is: its MPI rank when run under MPI (mpi4py already imported by the engine)."""
    mpi_rank = mpi_size = None
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None:
        mpi_rank, mpi_size = mpi.COMM_WORLD.Get_rank(), mpi.COMM_WORLD.Get_size()
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "mpi_rank": mpi_rank,
        "mpi_size": mpi_size,
        "cpu_count": os.cpu_count() or 1,
        "env_keys": sorted(os.environ),
    }


def my_rank() -> int:
    rank = _state["rank"]
    if rank is None:
        raise RuntimeError("jupyter-dist: this engine was given no rank yet")
    return rank


def apply_env(env: dict[str, str]) -> None:
    """Set `env`; keys set by an earlier run but absent now get their inherited values back."""
    saved: dict[str, Any] = _state["saved"]
    for key in list(saved):
        if key not in env:
            original = saved.pop(key)
            if original is _MISSING or original is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = original
    for key, value in env.items():
        if key not in saved:
            saved[key] = os.environ.get(key)
        os.environ[key] = value


def setup(envs_by_rank: dict[int, dict[str, str]], hooks: tuple[Callable[[], None], ...] = (),
          cwd: str | None = None) -> dict[str, Any]:
    """Apply this rank's environment and the framework's hooks; one round trip per change."""
    rank = my_rank()
    apply_env(envs_by_rank[rank])
    own_session()  # a scheduler autogroup per rank, as torchrun's workers have (engine/sessions.py)
    if cwd and os.path.isdir(cwd) and os.getcwd() != cwd:
        os.chdir(cwd)
    if cwd and cwd not in sys.path:
        sys.path.insert(0, cwd)
    for hook in hooks:
        hook()
    sync_torch_threads()
    if not _state.get("frozen"):
        # Once, before any cell ran: the engine's own objects (ipykernel, zmq, ipyparallel, the
        # frameworks' modules) never die, so later collections, which a training loop triggers
        # often, need not scan them. Objects of the user's cells are never frozen.
        gc.freeze()
        _state["frozen"] = True
    return {"rank": rank, "pid": os.getpid()}


def assign_rank(rank: int, stack_dir: str, agent_token: str, controller_ip: str) -> tuple[str, int]:
    """Take `rank`: watch its cells, flush its output before it dies, arm its stack files, record its
    collectives, lower gloo's loop threads where the node is crowded, watch for a flood of output there, sample its resources, and start its agent where the controller reaches this engine;
    returns the agent's address."""
    _state["rank"] = rank
    cells.watch(get_ipython())
    _flush_before_dying()
    arm_stack_files(stack_dir, rank)
    stacks.register()
    crash_records.register()
    collectives.register()
    gloo_loop.install()  # gloo's spinning loop behind the training on a crowded node
    flood_signal.register()  # a crowded node's flooding rank lightens its session itself
    resources.register()
    release.register()
    cell_input.register()
    return agent.start(agent_token, source_address(controller_ip))


def assign_ranks(table: dict[tuple[str, int], int], stack_dir: str, agent_token: str,
                 controller_ip: str) -> tuple[str, int]:
    """`assign_rank` with this engine's line of the whole table ((host, pid) -> rank): one message
    to all engines instead of one round trip per engine."""
    return assign_rank(table[(socket.gethostname(), os.getpid())], stack_dir, agent_token, controller_ip)


def _flush_before_dying() -> None:
    """Output printed just before a crash must reach the notebook: the engine's streams send what
    was written within 20 ms (not ipykernel's 0.2 s), and flush before `os._exit`.

    Not a flush per line: each flush waits for ipykernel's I/O thread and makes one message through
    the controller per line, which made a burst of printed lines 20-35x slower than `%%px --stream`
    (benchmarks/README.md). A line 20 ms old is sent even if the process is then killed."""
    if _state.get("flushing"):
        return
    _state["flushing"] = True
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "flush_interval"):
            stream.flush_interval = FLUSH_INTERVAL_S
            _flush_until_sent(stream)
    real_exit = os._exit

    def _exit(code: int) -> None:
        with contextlib.suppress(Exception):
            publish(EXIT, ExitData(code=int(code)))
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # dying anyway
                stream.flush()
        time.sleep(0.1)  # let the I/O thread put the exit code and last lines on the wire
        real_exit(code)

    os._exit = _exit


def has_unsent(pending: Any) -> bool:
    """Whether ipykernel's buffers of unsent text (by parent message) hold any; True where unsure.

    The I/O thread swaps and closes these buffers as it sends them, while the cell's thread looks:
    a buffer closed in between is text being sent (`tell` raises ValueError). This runs inside ipykernel's
    `execute_request`, whose reply is never sent when its flush raises: the cell then waited forever
    for that rank (a 32-rank burst, one run in a few hundred)."""
    if pending is None:
        return True
    try:
        buffers = list(pending.values())
    except RuntimeError:  # changed while listed
        return True
    for buffer in buffers:
        try:
            if buffer.tell():
                return True
        except ValueError:  # closed by the I/O thread as it sent it
            return True
    return False


def _flush_until_sent(stream: Any) -> None:
    """Make `stream.flush()` return only once its message is on the iopub socket.

    ipykernel's flush from the cell's thread queues the flush on its I/O thread and waits for an event
    queued after it, but the flush itself queues the send behind that event: `flush()` returned before
    the line reached zmq, and a rank killed right then (a segfault after `print(..., flush=True)`) lost
    its last line about one time in six (tests/faults/test_faults.py). One more event queued after the
    send closes that gap: one round trip to the I/O thread per explicit flush of written text (the 20 ms
    timer's flushes do not pass here)."""
    flush = stream.flush

    def flush_sent() -> None:
        wrote = has_unsent(getattr(stream, "_buffers", None))  # ipykernel's text not yet sent, by parent
        flush()
        if not wrote:  # nothing to wait for (ipykernel flushes after every cell)
            return
        pub = getattr(stream, "pub_thread", None)
        thread = getattr(pub, "thread", None)
        if pub is None or thread is None or not thread.is_alive() or thread.ident == threading.get_ident():
            return
        sent = threading.Event()
        pub.schedule(sent.set)
        sent.wait(FLUSH_SENT_WAIT_S)

    stream.flush = flush_sent
