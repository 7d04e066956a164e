"""This rank's stacks, as the agent reports them: the main thread's first, frames outermost first.

Each frame is [file, line, function, source line]. Answered from the agent's thread, so it works
while the main thread waits in a collective, a sleep or a lock. While the engine waits on workers
of its own (--fresh's child, torchrun's workers: engine/workers.py), their stacks come first, read
by py-spy and marked with the worker's pid and rank; run/stacks.py's `by_rank` shows them as the ranks'.
"""

from __future__ import annotations

import json
import linecache
import os
import shutil
import signal
import subprocess
import sys
import threading
import traceback
from typing import Any

from jupyter_dist.engine import agent, workers

PY_SPY_S = 0.8  # for one worker's read: the notebook gives a rank's agent about a second to answer


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
    return [*(t for rank, pid in workers.workers() for t in worker_stacks(rank, pid)), *stacks]


def worker_stacks(rank: int | None, pid: int) -> list[dict[str, Any]]:
    """A worker's threads as py-spy reads them from outside (engine/workers.py: --fresh, torchrun), each
    marked {"worker": pid, "rank": its rank or None (this engine's)}: the notebook shows them as the rank's."""
    mark = {"worker": pid, "rank": rank}
    exe = _py_spy()
    if exe is None:
        return [{**mark, "thread": "(py-spy is not installed: pip install py-spy)", "main": False, "frames": []}]
    threads: Any = None
    try:
        done = subprocess.run([exe, "dump", "--json", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=PY_SPY_S, check=False)
        why = (done.stderr or done.stdout or "failed").strip()[:200]
        if done.returncode == 0:
            threads = json.loads(done.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        why = f"{type(e).__name__}: {e}"
    if not isinstance(threads, list):
        return [{**mark, "thread": f"(py-spy could not read pid {pid}: {why})", "main": False, "frames": []}]
    return py_spy_threads(threads, pid, mark)


def py_spy_threads(threads: list[dict[str, Any]], pid: int, mark: dict[str, Any]) -> list[dict[str, Any]]:
    """py-spy's JSON dump (frames innermost first) as thread_stacks' entries (outermost first), main first."""
    out = []
    for t in threads:
        frames = [[f.get("filename", "?"), int(f.get("line") or 0), f.get("name", "?"),
                   linecache.getline(f.get("filename", ""), int(f.get("line") or 0)).strip()]
                  for f in reversed(t.get("frames") or [])]
        main = t.get("os_thread_id") == pid or t.get("thread_name") == "MainThread"
        out.append({**mark, "thread": t.get("thread_name") or f"thread {t.get('thread_id')}", "main": main,
                    "frames": frames})
    out.sort(key=lambda s: not s["main"])
    return out


def _py_spy() -> str | None:
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")  # the venv's, else one on PATH
    return beside if os.path.exists(beside) else shutil.which("py-spy")


def interrupt(_: dict[str, Any] | None = None) -> bool:
    """SIGINT to this process: the main thread gets KeyboardInterrupt where Python can raise it."""
    os.kill(os.getpid(), signal.SIGINT)
    return True


def register() -> None:
    agent.register("stacks", thread_stacks)
    agent.register("interrupt", interrupt)
