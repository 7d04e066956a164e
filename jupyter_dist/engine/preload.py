"""Heavy modules imported in a thread of a new engine, while it registers and is given its rank.

Started by the engine's `--IPEngine.startup_command` (`cluster/preload.py`), right after MPI init,
so that the framework's set-up (`-f pytorch` imports torch.distributed on every rank) finds them
imported, or being imported, instead of starting the import only after every engine registered and
was mapped. A module that fails to import here is left alone: the set-up or the cell imports it
again and shows its error where it belongs. Environment a module reads at import (OMP_NUM_THREADS for
torch) is applied later by the set-up (`torch_hooks.sync_torch_threads`); CUDA is not initialised
by importing torch, so CUDA_VISIBLE_DEVICES set afterwards still applies.
"""

from __future__ import annotations

import contextlib
import importlib
import threading

_threads: list[threading.Thread] = []


def _import_all(names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(Exception):  # the set-up or the cell imports it again and reports
            importlib.import_module(name)


def start(names: list[str]) -> None:
    """Import `names` in a daemon thread; returns at once."""
    t = threading.Thread(target=_import_all, args=(list(names),), name="jupyter-dist-preload", daemon=True)
    t.start()
    _threads.append(t)


def wait(timeout: float | None = None) -> bool:
    """Wait for the imports started here; True when none is still running."""
    for t in _threads:
        t.join(timeout)
    return not any(t.is_alive() for t in _threads)
