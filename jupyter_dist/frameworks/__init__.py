"""The framework registry: every module in this package that defines a `Framework` subclass.

Adding a framework means adding one module here (plus a test and a tutorial); third-party
packages can add one through the `jupyter_dist.frameworks` entry point group.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from importlib.metadata import entry_points

from IPython.core.error import UsageError

from jupyter_dist.frameworks.base import Framework, RunContext

__all__ = ["Framework", "RunContext", "get", "registry"]


@cache
def registry() -> dict[str, Framework]:
    """name -> framework, in the order the choices are offered (`Framework.order`, then name).

    The one list of frameworks: `-f`, the panel, the sidebar's `welcome` and export read it."""
    found: dict[str, Framework] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name == "base":
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        for obj in vars(mod).values():
            if isinstance(obj, type) and issubclass(obj, Framework) and obj is not Framework and obj.__module__ == mod.__name__:
                found[obj.name] = obj()
    for ep in entry_points(group="jupyter_dist.frameworks"):
        cls = ep.load()
        found[cls.name] = cls()
    return dict(sorted(found.items(), key=lambda item: (item[1].order, item[0])))


def get(name: str) -> Framework:
    try:
        return registry()[name]
    except KeyError:
        known = ", ".join(sorted(registry()))
        raise UsageError(f"-f/--framework {name!r} is not available here; available: {known}.") from None
