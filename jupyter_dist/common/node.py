"""What one node has (GPUs, InfiniBand ports, interfaces, MPI): detected on the node by the engine
side (`engine.node_probe`), read by the kernel's plan. Travels engine -> kernel as JSON."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class IBPort:
    device: str
    port: int
    state: str  # "ACTIVE", "DOWN", "INIT", ... (the word after "N: " in the sysfs file)
    link_layer: str  # "InfiniBand" or "Ethernet" (RoCE)

    @property
    def active(self) -> bool:
        return self.state.upper() == "ACTIVE"

    @property
    def name(self) -> str:
        return f"{self.device}:{self.port}"


@dataclass(frozen=True)
class NodeFabric:
    """What one node has, as detected on it. Travels engine -> kernel via `to_json`."""

    hostname: str
    gpu_count: int
    gpu_names: tuple[str, ...]
    ib_ports: tuple[IBPort, ...]
    interfaces: tuple[str, ...]
    route_interface: str | None
    mpi: str | None
    topo_file: str | None
    vm_size: str | None
    mpi_ucx: bool | None = None  # Open MPI has its UCX pml (None: unknown / not Open MPI)
    topo_files_found: tuple[str, ...] = ()  # every candidate topology file present
    cpu_count: int | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for f in fields(self):
            if isinstance(data[f.name], tuple):
                data[f.name] = list(data[f.name])
        return data

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NodeFabric:
        """Inverse of `to_json`; keys this version does not know are ignored."""
        known = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {k: v for k, v in d.items() if k in known}
        kw["ib_ports"] = tuple(p if isinstance(p, IBPort) else IBPort(**p) for p in kw.get("ib_ports", ()))
        for name in ("gpu_names", "interfaces", "topo_files_found"):
            if name in kw:
                kw[name] = tuple(kw[name])
        return cls(**kw)
