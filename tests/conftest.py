"""Shared fixtures. Integration tests start one cluster per module and reuse it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
# Tests never touch the user's real state directory.
os.environ.setdefault("JUPYTER_DIST_DIR", str(ARTIFACTS / "state"))
# No warm spare engine beside the ranks (DistSettings.spare_engines, 1 for users): one more engine per
# module's cluster would cost CI's 2 cores; tests/faults/test_replace.py runs with the users' default.
os.environ.setdefault("JUPYTER_DIST_SPARE_ENGINES", "0")
# No engines started at `%load_ext` (DistSettings.background_start): a test's kernel starts none it did not
# ask for; tests/integration/test_background_start.py turns it on in its own kernels.
os.environ["JUPYTER_DIST_BACKGROUND_START"] = "0"


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



@pytest.fixture
def rpc_framework(monkeypatch):
    """The ninth framework of docs/architecture.md, installed with its entry point for the test."""
    from plugin_framework import plugin_registered

    with plugin_registered(monkeypatch) as fw:
        yield fw
