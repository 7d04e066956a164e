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


def test_process_count_is_the_total_and_defaults_to_node_count():
    assert PyTorchConfiguration(node_count=2).process_count is None
    assert config_to_flags("c", PyTorchConfiguration(communication_backend="Gloo", node_count=2)) == {
        "framework": "pytorch", "nodes": 2, "procs_per_node": 1, "backend": "gloo"}
    flags = config_to_flags("c", PyTorchConfiguration(communication_backend="Gloo", process_count=6, node_count=3))
    assert (flags["nodes"], flags["procs_per_node"]) == (3, 2)


@pytest.mark.parametrize("name", ["Nccl", "nccl", "NCCL", "Gloo", "gloo", "GLOO", "gLoO"])
def test_backend_any_case_maps_to_the_flag(name):
    flags = config_to_flags("c", PyTorchConfiguration(communication_backend=name, process_count=2, node_count=1))
    assert flags["backend"] == name.lower()


@pytest.mark.parametrize("bad", ["mpi", "MPI", "", "nccl2", None, 1])
def test_other_backends_are_errors(bad):
    with pytest.raises(ValueError, match="communication_backend must be Nccl or Gloo"):
        PyTorchConfiguration(communication_backend=bad)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"process_count": 0}, "process_count"), ({"node_count": 0}, "node_count"), ({"process_count": 2.0}, "process_count")])
def test_pytorch_counts_validated(kwargs, name):
    with pytest.raises(ValueError, match=name):
        PyTorchConfiguration(communication_backend="Gloo", **kwargs)


def test_tensorflow_counts_validated():
    assert TensorflowConfiguration(worker_count=2, parameter_server_count=0).parameter_server_count == 0
    with pytest.raises(ValueError, match="worker_count"):
        TensorflowConfiguration(worker_count=0)
    with pytest.raises(ValueError, match="parameter_server_count"):
        TensorflowConfiguration(parameter_server_count=-1)


def test_divisibility_message_names_both_counts():
    with pytest.raises(UsageError) as info:
        config_to_flags("job", PyTorchConfiguration(communication_backend="Gloo", process_count=5, node_count=2))
    assert str(info.value) == "--config job: process_count 5 does not divide evenly over node_count 2."


def test_config_feeds_the_run_spec_and_flags_win():
    from jupyter_dist.plan.defaults import RunDefaults
    from jupyter_dist.plan.spec import parse_args, resolve

    cfg = config_to_flags("c", PyTorchConfiguration(communication_backend="Gloo", process_count=4, node_count=2))
    spec = resolve(parse_args("-f deepspeed --config c"), RunDefaults(), config=cfg)
    assert (spec.framework, spec.nodes, spec.procs_per_node, spec.backend) == ("deepspeed", 2, 2, "gloo")
    mpi = config_to_flags("c", MpiConfiguration(process_count_per_node=2, node_count=2))
    spec = resolve(parse_args("--config c"), RunDefaults(), config=mpi)
    assert (spec.framework, spec.nodes, spec.procs_per_node) == ("mpi", 2, 2)
