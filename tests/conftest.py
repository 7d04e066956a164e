"""Shared fixtures. Integration tests start one cluster per module and reuse it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
# Tests never touch the user's real state directory.
os.environ.setdefault("JUPYTER_DIST_DIR", str(ARTIFACTS / "state"))


@pytest.fixture(scope="module")
def shell():
    """An IPython shell with jupyter_dist loaded into a fresh session; its cluster stops after the module."""
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    import jupyter_dist
    from jupyter_dist.plan.defaults import STORE

    ip = start_ipython() or get_ipython()  # start_ipython returns None once it has run
    STORE.reset()
    jupyter_dist._session = None
    jupyter_dist.load_ipython_extension(ip)
    session = jupyter_dist.get_session()
    yield ip
    session.shutdown()
    jupyter_dist._session = None
    STORE.reset()


@pytest.fixture
def distrun(shell, capsys):
    """`distrun(flags, cell)` -> (stdout, stderr) of the run."""

    def run(flags: str, cell: str | None = None):
        if cell is None:
            shell.run_line_magic("distrun", flags)
        else:
            shell.run_cell_magic("distrun", flags, cell)
        return capsys.readouterr()

    return run


PLUGINS = Path(__file__).resolve().parent / "plugins"


@pytest.fixture
def rpc_framework(tmp_path, monkeypatch):
    """The ninth framework of docs/architecture.md (tests/plugins/jd_rpc_framework.py), registered as a
    third-party package registers one: an installed distribution with a `jupyter_dist.frameworks` entry point."""
    from jupyter_dist import frameworks

    dist = tmp_path / "jd_rpc_framework-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: jd-rpc-framework\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[jupyter_dist.frameworks]\nrpc = jd_rpc_framework:PyTorchRpc\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(PLUGINS))
    frameworks.registry.cache_clear()
    yield frameworks.get("rpc")
    frameworks.registry.cache_clear()
