"""`input()` and `sys.stdin` on the ranks, as under `mpirun`: rank 0 asks the notebook, the others get EOF.

A rank cannot reach the notebook's stdin: its kernel refuses (`StdinNotImplementedError`). So while a
script runs, `builtins.input` on rank 0 sends the prompt to the notebook (channel.INPUT, with the
rank's output), and waits; the notebook asks the user with the kernel's own input request, as
`input()` in a cell does, and hands the line back through the rank's agent (channel.INPUT_OP), which
answers on its own thread while this one waits. An answer of end of input raises `EOFError`, as does
`input()` on every other rank (their stdin is `/dev/null` under `mpirun`). `sys.stdin` reads alike:
on rank 0 each line read (`readline()`, `for line in sys.stdin`, `read()` up to the end) is a line
asked of the notebook, and an empty answer (a notebook's input box has no Ctrl-D) ends the stream; elsewhere `sys.stdin` is empty. So in a
script and in every `%%distrun` cell (engine.cell_input; not in the user's own `%px` cells, whose
requests no run loop answers).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import itertools
import sys
import threading
from collections.abc import Iterator
from typing import Any

from jupyter_dist.common.channel import INPUT, INPUT_OP, InputAnswer, InputRequest
from jupyter_dist.engine import agent
from jupyter_dist.engine.line_stdin import LineStdin
from jupyter_dist.engine.publish import publish

_ids = itertools.count(1)
_lock = threading.Lock()
_waiting: dict[int, tuple[threading.Event, list[InputAnswer]]] = {}  # request id -> (set when answered, answer)


def answer(args: dict[str, Any]) -> bool:
    """The agent's handler: the notebook's answer to request `args["id"]`; False if none waits for it."""
    with _lock:
        waiting = _waiting.get(int(args.get("id", -1)))
    if waiting is None:
        return False
    event, box = waiting
    box.append(InputAnswer(**args))  # type: ignore[typeddict-item]
    event.set()
    return True


def ask_notebook(prompt: Any = "") -> str:
    """`input()` on rank 0: the notebook's answer (blocks until it comes)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()  # what the script printed before the question shows first
    rid = next(_ids)
    event, box = threading.Event(), []
    with _lock:
        _waiting[rid] = (event, box)
    try:
        publish(INPUT, InputRequest(id=rid, prompt=str(prompt)))
        event.wait()
    finally:
        with _lock:
            _waiting.pop(rid, None)
    text = box[0].get("text")
    if text is None:
        raise EOFError("EOF when reading a line")
    return text


def no_input(prompt: Any = "") -> str:
    """`input()` on a rank other than 0: end of input, as with `mpirun`'s `/dev/null`."""
    raise EOFError("EOF when reading a line (only rank 0 reads the notebook's input, as under mpirun)")


@contextlib.contextmanager
def asking_notebook(rank: int | None = None) -> Iterator[None]:
    """While the script or cell runs, `input()` and `sys.stdin` as above (rank: by default the engine's)."""
    if rank is None:
        rank = my_rank()
    agent.register(INPUT_OP, answer)
    old_input, old_stdin = builtins.input, sys.stdin
    builtins.input = ask_notebook if rank == 0 else no_input
    sys.stdin = LineStdin(ask_notebook) if rank == 0 else io.StringIO("")
    try:
        yield
    finally:
        builtins.input, sys.stdin = old_input, old_stdin


def my_rank() -> int:
    """This engine's rank (-1 before it has one)."""
    setup = sys.modules.get("jupyter_dist.engine.setup")
    rank = setup._state.get("rank") if setup is not None else None
    return rank if isinstance(rank, int) else -1
