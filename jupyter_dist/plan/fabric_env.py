"""The NCCL/UCX/MPI environment a node's fabric calls for, and the backend a run uses.

Pure: it reads a `NodeFabric` (what `engine.node_probe.detect_node` found on the node, handed in
by the plan's caller) and the run's choices and returns values, so it is tested with hand-made
nodes. The rules are those of `reference/rank-env.md`, "NCCL, InfiniBand and the network".
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from IPython.core.error import UsageError

from jupyter_dist.common.node import IBPort, NodeFabric
from jupyter_dist.common.vm_size import is_rdma_vm_size

__all__ = [
    "IBPort",
    "NodeFabric",
    "choose_interface",
    "fabric_env",
    "nccl_ib_hca",
    "resolve_backend",
    "transport_summary",
    "usable_ib_ports",
]

# Interfaces that never carry traffic between nodes. docker0 has the same address on every
# host, so NCCL bootstrapping over it makes each rank talk to itself.
_NEVER_IFACES = ("docker0",)
_VIRTUAL_PREFIXES = (
    "docker",
    "virbr",
    "veth",
    "br-",
    "ifb",
    "cni",
    "flannel",
    "cali",
    "vxlan",
    "tunl",
    "kube",
)
_PREFERRED_PREFIXES = ("eth", "en", "ib", "bond")
# Azure's accelerated-networking VF (renamed mlx5_an<N> by the HPC images' udev rule) shows up
# under /sys/class/infiniband with an Ethernet link layer, but it is no RDMA fabric.
_AZURE_AN_DEVICE = re.compile(r"^mlx\d+_an\d+$")


# ---------------------------------------------------------------------------------------------
# pure decisions


def usable_ib_ports(node: NodeFabric) -> tuple[IBPort, ...]:
    """ACTIVE ports NCCL can use: InfiniBand, or RoCE where the VM is not a known non-RDMA size.

    Azure's accelerated-networking device (mlx5_an0) and, on a known non-RDMA Azure size, any
    Ethernet-layer port are the VM's ordinary NIC, not RoCE.
    """
    non_rdma_size = node.vm_size is not None and is_rdma_vm_size(node.vm_size) is False
    out = []
    for p in node.ib_ports:
        if not p.active or _AZURE_AN_DEVICE.match(p.device):
            continue
        if p.link_layer.lower() == "ethernet" and non_rdma_size:
            continue
        out.append(p)
    return tuple(out)


def choose_interface(node: NodeFabric, master_addr: str, all_local: bool) -> str | None:
    """The interface for NCCL/Gloo bootstrap and sockets: the one routing to the master.

    Never docker0; "lo" only when every node is this host. Falls back to the first
    physical-looking interface when the route is unknown or unusable.
    """
    if all_local:
        return "lo"
    route = node.route_interface
    if route and route != "lo" and route not in _NEVER_IFACES:
        return route
    candidates = [i for i in node.interfaces if i != "lo" and not i.startswith(_VIRTUAL_PREFIXES)]
    for prefix in _PREFERRED_PREFIXES:
        for name in candidates:
            if name.startswith(prefix):
                return name
    return candidates[0] if candidates else None


def resolve_backend(
    requested: str, gpus_per_node: int, procs_per_node: int, *, where: str = "this node"
) -> tuple[str, str | None]:
    """The torch.distributed backend to use and, when `auto` had to fall back, one line saying why."""
    if requested == "auto":
        if gpus_per_node >= procs_per_node and gpus_per_node > 0:
            return "nccl", None
        if gpus_per_node == 0:
            return "gloo", "no CUDA GPUs found: using gloo"
        return "gloo", (
            f"{_n(gpus_per_node, 'CUDA GPU')} for {procs_per_node} processes per node: using gloo "
            "(NCCL needs one GPU per process)"
        )
    if requested == "nccl":
        if gpus_per_node < procs_per_node or gpus_per_node == 0:
            need = max(1, procs_per_node)
            raise UsageError(
                f"--backend nccl needs at least {_n(need, 'CUDA GPU')} per node, but {where} has {gpus_per_node}."
            )
        return "nccl", None
    if requested in ("gloo", "mpi"):
        return requested, None
    raise UsageError(f"--backend must be auto, nccl, gloo or mpi, not {requested!r}.")


def fabric_env(
    node: NodeFabric,
    *,
    backend: str,
    ib: str,
    nccl_debug: bool,
    master_addr: str,
    all_local: bool,
    mpi_impl: str | None = None,
) -> dict[str, str]:
    """The fabric defaults for every rank on `node` (rank-env.md, "NCCL, InfiniBand and the network").

    `backend` is the resolved one. NCCL variables are set when NCCL may run: backend nccl, or
    GPUs on the node (DeepSpeed, Horovod and Lightning can pick NCCL on their own).

    The OMPI_MCA_* values do not reconfigure the engines, which already run inside Open MPI:
    they reach MPI programs started later from a rank (script mode, `mpiexec` in a cell) and
    the job files `%dist export` writes. `mpi_impl` overrides the MPI found on the node
    (e.g. "Open MPI 4.1.5", "MPICH").
    """
    if ib not in ("auto", "on", "off"):
        raise UsageError(f"--ib must be auto, on or off, not {ib!r}.")
    ports = () if ib == "off" else usable_ib_ports(node)
    if ib == "on" and not ports:
        raise UsageError(
            f"--ib on needs an ACTIVE InfiniBand port, but {node.hostname} has {_ib_state_words(node)}."
        )
    env: dict[str, str] = {}
    nccl = backend == "nccl" or node.gpu_count > 0
    if backend == "nccl":
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    if nccl:
        if ports:
            env["NCCL_IB_DISABLE"] = "0"
            env["NCCL_IB_HCA"] = nccl_ib_hca(ports, node.ib_ports)
            env["NCCL_IB_PCI_RELAXED_ORDERING"] = "1"
        else:
            env["NCCL_IB_DISABLE"] = "1"
        if node.topo_file:
            env["NCCL_TOPO_FILE"] = node.topo_file
    ompi_major = _openmpi_major(mpi_impl if mpi_impl is not None else node.mpi)
    if ports:
        env["UCX_NET_DEVICES"] = ",".join(p.name for p in ports)
        if ompi_major is not None and node.mpi_ucx is not False:
            env["OMPI_MCA_pml"] = "ucx"
    else:
        env["UCX_TLS"] = "tcp"
        if ompi_major is not None:
            env["OMPI_MCA_pml"] = "ob1"
            env["OMPI_MCA_btl"] = "self,tcp,sm" if ompi_major >= 5 else "self,tcp,vader"
    iface = choose_interface(node, master_addr, all_local)
    if iface:
        env["NCCL_SOCKET_IFNAME"] = iface
        env["GLOO_SOCKET_IFNAME"] = iface
        if ompi_major is not None and not ports and not all_local:
            env["OMPI_MCA_btl_tcp_if_include"] = iface
    if nccl_debug:
        env["NCCL_DEBUG"] = "INFO"
        env["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
    return env


def nccl_ib_hca(ports: Sequence[IBPort], all_ports: Sequence[IBPort] = ()) -> str:
    """NCCL_IB_HCA for `ports`: device names, `dev:port` where a device also has unused ports.

    NCCL matches these as prefixes (mlx5_1 would also take mlx5_10); when another device's
    name starts with a chosen one, the list is made exact with a leading "=".
    """
    used = {p.device for p in ports}
    by_dev: dict[str, int] = {}
    for p in all_ports or ports:
        by_dev[p.device] = by_dev.get(p.device, 0) + 1
    items: list[str] = []
    for p in ports:
        whole = sum(1 for q in ports if q.device == p.device) == by_dev.get(p.device, 1)
        item = p.device if whole else p.name
        if item not in items:
            items.append(item)
    others = {p.device for p in all_ports} - used
    ambiguous = any(o.startswith(u) for o in others | used for u in used if o != u)
    return ("=" if ambiguous else "") + ",".join(items)


def transport_summary(
    node: NodeFabric, backend: str, ib: str, *, interface: str | None = None, single_node: bool = False
) -> str:
    """One line: what the collective traffic between nodes will go over."""
    ports = () if ib == "off" else usable_ib_ports(node)
    iface = interface or node.route_interface or "no interface found"
    fabric = _fabric_word(ports)
    names = ", ".join(p.name for p in ports)
    if backend == "nccl":
        if single_node:
            return "NCCL within the node (NVLink/PCIe/shared memory)"
        return f"NCCL over {fabric} ({names})" if ports else f"NCCL over sockets ({iface})"
    if backend == "mpi":
        if single_node:
            return "MPI within the node (shared memory)"
        if ports and node.mpi_ucx is not False:
            return f"MPI over UCX on {fabric} ({names})"
        return f"MPI over TCP ({iface})"
    return f"{backend} over TCP ({iface})"


# ---------------------------------------------------------------------------------------------
# helpers


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _fabric_word(ports: Sequence[IBPort]) -> str:
    layers = {p.link_layer.lower() for p in ports}
    if layers == {"ethernet"}:
        return "RoCE"
    if "ethernet" in layers:
        return "InfiniBand and RoCE"
    return "InfiniBand"


def _ib_state_words(node: NodeFabric) -> str:
    if not node.ib_ports:
        return "no InfiniBand device"
    return "only " + ", ".join(f"{p.name} {p.state}" for p in node.ib_ports)


def _openmpi_major(text: str | None) -> int | None:
    """5 for "Open MPI 5.0.11 (...)", 4 for "openmpi4"; None when it is not Open MPI."""
    if not text or not re.search(r"open[\s_-]?mpi", text, re.IGNORECASE):
        return None
    m = re.search(r"open[\s_-]?mpi\D{0,3}(\d+)", text, re.IGNORECASE)
    return int(m.group(1)) if m else 5
