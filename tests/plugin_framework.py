"""A framework added the way a third-party package adds one: through the `jupyter_dist.frameworks`
entry point group (tests/ is on the pythonpath)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from jupyter_dist import frameworks
from jupyter_dist.frameworks import Framework, RunContext


class Jax(Framework):
    name = "jax"
    family = "jax"
    title = "JAX (jax.distributed)"
    module = None

    def rank_env(self, ctx: RunContext, rank: int) -> dict[str, str]:
        return {"JAX_PROCESS_ID": str(rank)}


class _EntryPoint:
    name = "jax"

    def load(self) -> type[Framework]:
        return Jax


@contextmanager
def plugin_registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The registry as it is with `Jax` installed through the entry point group, for the block."""

    def entry_points(group: str, **_kw: Any) -> list[_EntryPoint]:
        return [_EntryPoint()] if group == "jupyter_dist.frameworks" else []

    with monkeypatch.context() as m:
        m.setattr(frameworks, "entry_points", entry_points)
        frameworks.registry.cache_clear()
        try:
            yield
        finally:
            frameworks.registry.cache_clear()
