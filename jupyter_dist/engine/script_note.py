"""The one line a warm re-run prints when it cannot be made clean, and why (script mode).

engine.script_reset resets what it can reach. Some state it cannot, and a fresh process (`--fresh`)
is then the honest answer; this module names the case in one line on the rank's stderr:

- MPI finalized by an earlier run (`MPI.Finalize()`): MPI cannot start again in this process.
- A compiled extension beside the script changed since it was imported: a process cannot load an
  extension module twice; the old one stays.
- Threads the script started and left running (not daemons): a process would wait for them at its
  end; here they live on beside the next run (told after the run).

Also: Horovod's rendezvous of an earlier `-f horovod` run on rank 0 holds the port that TensorFlow's
first task takes (the cluster's first task port); before a script with a `TF_CONFIG` runs, it is stopped.
(A TensorFlow cluster other than the one the engines joined restarts them: frameworks/tensorflow.py.)
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from jupyter_dist.engine.frameworks import horovod

PREFIX = "jupyter-dist: this warm re-run cannot be made clean: "
HINT = "; run the script with --fresh (a new process per rank) or %dist restart"
EXTENSIONS = (".so", ".pyd")


def say(reason: str) -> None:
    print(PREFIX + reason + HINT, file=sys.stderr, flush=True)


def before_run(changed_modules: dict[str, str]) -> list[str]:
    """The reasons this run cannot start clean (`changed_modules`: name -> file, changed since imported)."""
    reasons = []
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_finalized():
        reasons.append("MPI was finalized by an earlier run (MPI.Finalize()) and cannot start again in this process")
    for name, path in sorted(changed_modules.items()):
        if path.endswith(EXTENSIONS):
            reasons.append(f"the compiled extension {name} changed, and a process cannot load an extension twice")
    if os.environ.get("TF_CONFIG"):
        horovod.stop_rendezvous()  # its port is the first task's (engine.frameworks.horovod)
    return reasons


@contextmanager
def noted(changed_modules: dict[str, str]) -> Iterator[None]:
    """Around a warm run: the reasons before it, the threads it left after it, one line each."""
    for reason in before_run(changed_modules):
        say(reason)
    before = set(threading.enumerate())
    try:
        yield
    finally:
        left = [t.name for t in threading.enumerate() if t not in before and t.is_alive() and not t.daemon]
        if left:
            say(f"the script left {len(left)} thread(s) running ({', '.join(sorted(left)[:3])}), "
                "which live on in the engine")
