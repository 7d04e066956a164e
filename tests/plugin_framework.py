"""The ninth framework of docs/architecture.md, registered the way a third-party package registers one:
an installed distribution whose `jupyter_dist.frameworks` entry point names `PyTorchRpc`
(tests/plugins/jd_rpc_framework.py). tests/ is on the pythonpath; conftest.py's `rpc_framework`
fixture wraps `plugin_registered`."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from jupyter_dist import frameworks
from jupyter_dist.frameworks import Framework

PLUGINS = Path(__file__).resolve().parent / "plugins"
NAME, TITLE = "rpc", "PyTorch RPC"


@contextmanager
def plugin_registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[Framework]:
    """While inside: the package `jd-rpc-framework` is installed (on sys.path, with its entry point)."""
    with tempfile.TemporaryDirectory() as site, monkeypatch.context() as m:
        dist = Path(site) / "jd_rpc_framework-0.1.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: jd-rpc-framework\nVersion: 0.1\n")
        (dist / "entry_points.txt").write_text(f"[jupyter_dist.frameworks]\n{NAME} = jd_rpc_framework:PyTorchRpc\n")
        m.syspath_prepend(site)
        m.syspath_prepend(str(PLUGINS))
        frameworks.registry.cache_clear()
        try:
            yield frameworks.get(NAME)
        finally:
            frameworks.registry.cache_clear()
