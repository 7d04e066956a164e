from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from jupyter_dist.azureml import (
    MpiConfiguration,
    PyTorchConfiguration,
    TensorflowConfiguration,
    config_to_flags,
)


def test_defaults_match_sdk_v1():
    m = MpiConfiguration()
    assert (m.process_count_per_node, m.node_count) == (1, 1)
    p = PyTorchConfiguration()
    assert (p.communication_backend, p.process_count, p.node_count) == ("Nccl", None, 1)
    t = TensorflowConfiguration()
    assert (t.worker_count, t.parameter_server_count) == (1, 1)


def test_mapping():
    assert config_to_flags("c", MpiConfiguration(process_count_per_node=4, node_count=2)) == {
        "framework": "mpi", "nodes": 2, "procs_per_node": 4}
    assert config_to_flags("c", PyTorchConfiguration(communication_backend="gloo", process_count=8, node_count=2)) == {
        "framework": "pytorch", "nodes": 2, "procs_per_node": 4, "backend": "gloo"}
    assert config_to_flags("c", PyTorchConfiguration(node_count=3))["procs_per_node"] == 1
    assert config_to_flags("c", TensorflowConfiguration(worker_count=2, parameter_server_count=1)) == {
        "framework": "tensorflow", "nodes": 1, "procs_per_node": 3, "ps": 1}


def test_backend_case_insensitive_and_checked():
    assert PyTorchConfiguration(communication_backend="NCCL").communication_backend == "NCCL"
    with pytest.raises(ValueError, match="communication_backend"):
        PyTorchConfiguration(communication_backend="mpi")


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_counts_validated(bad):
    with pytest.raises(ValueError):
        MpiConfiguration(process_count_per_node=bad)


def test_process_count_must_divide():
    with pytest.raises(UsageError, match="does not divide"):
        config_to_flags("cfg", PyTorchConfiguration(communication_backend="Gloo", process_count=3, node_count=2))


def test_wrong_type_is_refused():
    with pytest.raises(UsageError, match="--config cfg is a dict"):
        config_to_flags("cfg", {"node_count": 2})
