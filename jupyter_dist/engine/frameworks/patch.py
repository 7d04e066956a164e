"""Patch a module when it is imported: engine hooks run before the cell imports the framework.

`when_imported("lightning.pytorch.trainer.trainer", fn)` calls `fn(module)` now if the module is
loaded, else right after its first import. Importing heavy frameworks at set-up is avoided.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

Patch = Callable[[ModuleType], None]
_waiting: dict[str, list[Patch]] = {}


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of a watched module so the patches run after it executes."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in _waiting:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        for patch in _waiting.pop(module.__name__, []):
            patch(module)


_FINDER = _Finder()


def when_imported(name: str, patch: Patch) -> None:
    """`patch(module)` once `name` is imported whole: now, or right after its import ends.

    Another thread may be importing it at this moment (engine/preload.py imports torch.distributed
    while the set-up installs its hooks): a module in `sys.modules` but still executing is waited
    for (its import lock), never patched half-made, where its functions are not defined yet."""
    module = sys.modules.get(name)
    if module is not None:
        _when_done(name, module, [patch])
        return
    pending = _waiting.setdefault(name, [])
    if patch not in pending:
        pending.append(patch)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    if name in sys.modules:  # another thread's import found its loader before the patch was waiting
        _when_done(name, sys.modules[name], _waiting.pop(name, []))


def _when_done(name: str, module: ModuleType, patches: list[Patch]) -> None:
    if _initializing(module):
        module = importlib.import_module(name)  # waits while another thread executes it (this thread's
        # own import, still running, is returned as it is: as before, patched as far as it got)
    for patch in patches:
        patch(module)


def _initializing(module: ModuleType) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def wrap_torch_distributed(dist: ModuleType, names: Iterable[str],
                           wrap: Callable[[str, Callable[..., Any]], Callable[..., Any]], mark: str) -> None:
    """Replace each named function of `torch.distributed` and of its `distributed_c10d` (where torch's own
    code calls it) by `wrap(name, fn)`, once: a function whose attribute `mark` is true is wrapped already."""
    c10d = getattr(dist, "distributed_c10d", None)
    for name in names:
        for module in (dist, c10d):
            fn = getattr(module, name, None) if module is not None else None
            if fn is not None and not getattr(fn, mark, False):
                setattr(module, name, wrap(name, fn))
