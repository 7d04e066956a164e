"""This rank's stacks, as the agent reports them: the main thread's first, frames outermost first.

Each frame is [file, line, function, source line]. Answered from the agent's thread, so it works
while the main thread waits in a collective, a sleep or a lock.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from typing import Any

from jupyter_dist.engine import agent


def thread_stacks(_: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every Python thread's stack but the agent's own: [{"thread", "main", "frames"}], main first."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    me = threading.get_ident()
    stacks = []
    for ident, frame in sys._current_frames().items():
        name = names.get(ident, f"thread {ident}")
        if ident == me or name.startswith("jupyter-dist agent"):
            continue
        frames = [[f.filename, f.lineno or 0, f.name, (f.line or "").strip()] for f in traceback.extract_stack(frame)]
        stacks.append({"thread": name, "main": ident == main, "frames": frames})
    stacks.sort(key=lambda s: (not s["main"], s["thread"]))
    return stacks


def interrupt(_: dict[str, Any] | None = None) -> bool:
    """SIGINT to this process: the main thread gets KeyboardInterrupt where Python can raise it."""
    os.kill(os.getpid(), signal.SIGINT)
    return True


def register() -> None:
    agent.register("stacks", thread_stacks)
    agent.register("interrupt", interrupt)
