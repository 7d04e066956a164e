"""What a script's second run in a warm engine must not inherit from its first (script mode).

A fresh process starts with no framework state, its own modules as they are on disk, warnings not
yet shown, its launcher's environment and working folder, and, where a framework takes a temporary
folder, an empty one. `fresh_state(path)` gives a warm engine's run the same start:

- Accelerate's state singletons (`PartialState`, `AcceleratorState`, `GradientState`) are cleared: they
  outlive `end_training()`, which destroys the process group they describe.
- DeepSpeed's communication backend is dropped when the group under it is gone.
- Keras's global state (layer names, which a checkpoint matches by) is cleared.
- Modules beside the script or under the working folder whose files changed since the last run are
  dropped from `sys.modules`, so the script imports them anew.
- Warnings show again (the registries of `once`/`default` are emptied; the filters the script set go).
- `tempfile` and `$TMPDIR` point into a folder of the run's own, removed after it.
- The environment and working folder the script changed are put back after it.

The torch process group is not destroyed between runs, and a script's own `destroy_process_group()`
keeps it (engine.script_group): made again by the same script it is handed back (engine.torch_hooks'
idempotent init), whereas a destroyed group whose DDP model is freed while the next group forms can
hang (docs/reliability.md). The run's objects are collected at its end, on every rank alike.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator

from jupyter_dist.engine import script_group

SKIP_PREFIXES = ("jupyter_dist",)  # never reloaded: this package's own modules, wherever they live

_state: dict[str, dict[str, float]] = {"mtimes": {}}  # module name -> its file's mtime after the last run


@contextlib.contextmanager
def fresh_state(path: str) -> Iterator[str]:
    """Reset before the script at `path` runs; put back after it. Yields the run's temp folder."""
    roots = script_roots(path)
    reset_frameworks()
    drop_changed_modules(roots)
    env, cwd = dict(os.environ), os.getcwd()
    old_tempdir = tempfile.tempdir
    tmp = tempfile.mkdtemp(prefix="jupyter-dist-script-")
    with warnings.catch_warnings(), script_group.kept():
        _warnings_afresh()
        tempfile.tempdir = tmp
        os.environ["TMPDIR"] = tmp
        try:
            yield tmp
        finally:
            tempfile.tempdir = old_tempdir
            _restore_env(env)
            with contextlib.suppress(OSError):
                os.chdir(cwd)
            gc.collect()  # the run's objects go now, on every rank alike (see the module's note)
            remember_modules(roots)
            shutil.rmtree(tmp, ignore_errors=True)


def script_roots(path: str) -> tuple[str, ...]:
    here = {os.path.dirname(os.path.abspath(path)), os.getcwd()}
    return tuple(sorted(os.path.join(os.path.realpath(d), "") for d in here))


# -- frameworks ------------------------------------------------------------------------

def reset_frameworks() -> None:
    """Each framework's process-wide state that a new process would not have (only those imported)."""
    state = sys.modules.get("accelerate.state")
    if state is not None:
        with contextlib.suppress(Exception):
            state.AcceleratorState._reset_state(reset_partial_state=True)
            state.GradientState._reset_state()
    comm = sys.modules.get("deepspeed.comm.comm")
    dist = sys.modules.get("torch.distributed")
    group_gone = dist is None or not dist.is_available() or not dist.is_initialized()
    if comm is not None and getattr(comm, "cdb", None) is not None and group_gone:
        comm.cdb = None
    keras = sys.modules.get("keras")
    if keras is not None:
        with contextlib.suppress(Exception):
            keras.backend.clear_session()


# -- modules beside the script ---------------------------------------------------------

_real: dict[str, str] = {}  # a module's __file__ -> its real path (asked once: modules seldom move)
INSTALLED = ("site-packages", "dist-packages")


def _local_modules(roots: tuple[str, ...]) -> dict[str, str]:
    """The user's modules: loaded from under `roots`, not installed packages and not this package."""
    out = {}
    for name, module in list(sys.modules.items()):
        if name == "__main__" or name.startswith(SKIP_PREFIXES):
            continue
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or any(part in path for part in INSTALLED):
            continue
        real = _real.get(path)
        if real is None:
            real = _real[path] = os.path.realpath(path)
        if real.startswith(roots):
            out[name] = real
    return out


def remember_modules(roots: tuple[str, ...]) -> None:
    """The modification times of the user's modules as the run leaves them."""
    mtimes = _state["mtimes"]
    for name, path in _local_modules(roots).items():
        with contextlib.suppress(OSError):
            mtimes[name] = os.stat(path).st_mtime


def drop_changed_modules(roots: tuple[str, ...]) -> list[str]:
    """Drop from `sys.modules` the user's modules whose files changed (or went) since the last run."""
    mtimes = _state["mtimes"]
    dropped = []
    _dropped.clear()
    for name, path in _local_modules(roots).items():
        try:
            changed = os.stat(path).st_mtime != mtimes.get(name)
        except OSError:
            changed = True
        if changed and name in mtimes:
            del sys.modules[name]
            mtimes.pop(name, None)
            dropped.append(name)
            _dropped[name] = path
    return dropped


_dropped: dict[str, str] = {}  # the modules dropped before this run: name -> file


def last_dropped() -> dict[str, str]:
    """The modules dropped before this run (changed since the last), name -> file (engine.script_note)."""
    return dict(_dropped)


# -- warnings and the environment ------------------------------------------------------

def _warnings_afresh() -> None:
    """Warnings already shown show again: the `once` registry emptied, every module's registry stale."""
    onceregistry = getattr(warnings, "onceregistry", None)
    if isinstance(onceregistry, dict):
        onceregistry.clear()
    for module in list(sys.modules.values()):
        registry = getattr(module, "__warningregistry__", None)
        if isinstance(registry, dict):
            registry.clear()
    mutated = getattr(warnings, "_filters_mutated", None)
    if mutated is not None:
        mutated()


def _restore_env(env: dict[str, str]) -> None:
    for key in [k for k in os.environ if k not in env]:
        del os.environ[key]
    for key, value in env.items():
        if os.environ.get(key) != value:
            os.environ[key] = value
