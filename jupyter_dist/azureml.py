"""Azure ML SDK v1's distributed-job configuration classes, for `%%distrun --config NAME`.

Same arguments, defaults and validation as `azureml.core.runconfig`'s classes, so an Azure ML
job example ports by changing the import.
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError


def _count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer of at least {minimum}, not {value!r}")
    return value


class MpiConfiguration:
    """MPI job: `process_count_per_node` processes on each of `node_count` nodes."""

    def __init__(self, process_count_per_node: int = 1, node_count: int = 1) -> None:
        self.process_count_per_node = _count("process_count_per_node", process_count_per_node, 1)
        self.node_count = _count("node_count", node_count, 1)

    def __repr__(self) -> str:
        return f"MpiConfiguration(process_count_per_node={self.process_count_per_node}, node_count={self.node_count})"


class PyTorchConfiguration:
    """PyTorch job: `process_count` processes in all (default: one per node)."""

    BACKENDS = ("nccl", "gloo")

    def __init__(self, communication_backend: str = "Nccl", process_count: int | None = None, node_count: int = 1) -> None:
        if not isinstance(communication_backend, str) or communication_backend.lower() not in self.BACKENDS:
            raise ValueError(f"communication_backend must be Nccl or Gloo, not {communication_backend!r}")
        self.communication_backend = communication_backend
        self.node_count = _count("node_count", node_count, 1)
        self.process_count = None if process_count is None else _count("process_count", process_count, 1)

    @property
    def total_processes(self) -> int:
        return self.node_count if self.process_count is None else self.process_count

    def __repr__(self) -> str:
        return (
            f"PyTorchConfiguration(communication_backend={self.communication_backend!r}, "
            f"process_count={self.process_count}, node_count={self.node_count})"
        )


class TensorflowConfiguration:
    """TensorFlow job: `worker_count` workers and `parameter_server_count` parameter servers."""

    def __init__(self, worker_count: int = 1, parameter_server_count: int = 1) -> None:
        self.worker_count = _count("worker_count", worker_count, 1)
        self.parameter_server_count = _count("parameter_server_count", parameter_server_count, 0)

    def __repr__(self) -> str:
        return (
            f"TensorflowConfiguration(worker_count={self.worker_count}, "
            f"parameter_server_count={self.parameter_server_count})"
        )


CONFIG_TYPES = (MpiConfiguration, PyTorchConfiguration, TensorflowConfiguration)


def config_to_flags(name: str, obj: Any) -> dict[str, Any]:
    """The `%%distrun` values a configuration object stands for."""
    if isinstance(obj, MpiConfiguration):
        return {"framework": "mpi", "nodes": obj.node_count, "procs_per_node": obj.process_count_per_node}
    if isinstance(obj, PyTorchConfiguration):
        total, nodes = obj.total_processes, obj.node_count
        if total % nodes:
            raise UsageError(
                f"--config {name}: process_count {total} does not divide evenly over node_count {nodes}."
            )
        return {
            "framework": "pytorch",
            "nodes": nodes,
            "procs_per_node": total // nodes,
            "backend": obj.communication_backend.lower(),
        }
    if isinstance(obj, TensorflowConfiguration):
        # Each worker and parameter server is one rank, on one node, as Azure ML lays them out.
        ranks = obj.worker_count + obj.parameter_server_count
        return {"framework": "tensorflow", "nodes": 1, "procs_per_node": ranks, "ps": obj.parameter_server_count}
    kinds = ", ".join(t.__name__ for t in CONFIG_TYPES)
    raise UsageError(f"--config {name} is a {type(obj).__name__}, not one of {kinds}.")
