"""DistMagics.parse keeps the last line's RunSpec while nothing it was resolved from changed."""

from __future__ import annotations

from dataclasses import replace

import pytest
from nodes import HERE

from jupyter_dist.azureml import PyTorchConfiguration
from jupyter_dist.plan.defaults import DefaultsStore
from jupyter_dist.run.session import DistSession
from jupyter_dist.ui.magics import DistMagics

NODE = replace(HERE, interfaces=("lo",))


@pytest.fixture
def magics() -> DistMagics:
    from IPython.testing.globalipapp import get_ipython

    session = DistSession(store=DefaultsStore())
    session._local_node = NODE
    session._mpiexec_found = True
    return DistMagics(get_ipython(), session)


def test_same_line_same_defaults_gives_the_same_spec(magics: DistMagics):
    first = magics.parse("-f mpi -N 2 -n 2")
    assert magics.parse("-f mpi -N 2 -n 2") is first
    assert magics.parse("-f mpi -N 2 -n 3") is not first


def test_changed_defaults_resolve_again(magics: DistMagics):
    first = magics.parse("-N 2 -n 2")
    assert first.timeout is None
    magics.session.store.update(timeout=5.0)  # as the panel or the sidebar would
    again = magics.parse("-N 2 -n 2")
    assert again is not first and again.timeout == 5.0


def test_config_variable_is_read_on_every_run(magics: DistMagics):
    ns = magics.shell.user_ns
    ns["jd_cfg"] = PyTorchConfiguration(communication_backend="Gloo", process_count=4, node_count=2)
    try:
        assert magics.parse("--config jd_cfg").nodes == 2
        ns["jd_cfg"] = PyTorchConfiguration(communication_backend="Gloo", process_count=4, node_count=4)
        assert magics.parse("--config jd_cfg").nodes == 4
    finally:
        ns.pop("jd_cfg", None)


def test_hostfile_is_read_on_every_run(magics: DistMagics, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a\nb\n")
    assert magics.parse(f"--hostfile {hostfile} -n 1").hosts == ("a", "b")
    hostfile.write_text("a\nb\nc\n")
    assert magics.parse(f"--hostfile {hostfile} -n 1").hosts == ("a", "b", "c")
