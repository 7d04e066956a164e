"""`atexit` handlers of a warm script run when the script ends, as at a process's exit (script mode).

A script that registers `atexit.register(save_results)` expects it to run when the script is over.
In a warm engine the process lives on, so the handler would run only when the engine stops, and pile
up with every run. While the script runs, a handler registered from the script's own code (its file,
or a module beside it or under the working folder) is kept here instead and run when the script ends,
last registered first, an error printed and ignored as Python does at exit. Handlers that installed
packages register as they are imported (logging's, a framework's thread pools) belong to the process,
which keeps those modules warm: they go to the real `atexit`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

INSTALLED = ("site-packages", "dist-packages")

_handlers: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []


def _the_scripts(filename: str, roots: tuple[str, ...]) -> bool:
    if filename.startswith("<") or any(part in filename for part in INSTALLED):
        return False
    return os.path.realpath(filename).startswith(roots)


@contextlib.contextmanager
def at_script_end(roots: tuple[str, ...]) -> Iterator[None]:
    """While the script runs, its own `atexit` handlers are kept; they run as it ends (`roots`: folders
    ending in a separator, the script's own and the working folder)."""
    real_register, real_unregister = atexit.register, atexit.unregister

    def register(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
        caller = sys._getframe(1).f_code.co_filename
        if not _the_scripts(caller, roots):
            return real_register(func, *args, **kwargs)
        _handlers.append((func, args, kwargs))
        return func

    def unregister(func: Callable[..., Any]) -> None:
        _handlers[:] = [h for h in _handlers if h[0] != func]
        real_unregister(func)

    atexit.register, atexit.unregister = register, unregister  # type: ignore[assignment]
    try:
        yield
    finally:
        atexit.register, atexit.unregister = real_register, real_unregister  # type: ignore[assignment]
        run_handlers()


def run_handlers() -> int:
    """Run the kept handlers, last first, each once; how many ran."""
    ran = 0
    while _handlers:
        func, args, kwargs = _handlers.pop()
        ran += 1
        try:
            func(*args, **kwargs)
        except BaseException:  # noqa: BLE001 - as at exit: printed, then the next handler
            print(f"Exception ignored in atexit callback {func!r}:", file=sys.stderr)
            traceback.print_exc()
    sys.stderr.flush()
    return ran
