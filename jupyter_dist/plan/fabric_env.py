"""GPUs, InfiniBand and network interfaces of a node, and the NCCL/UCX/MPI environment they call for.

`detect_node` runs on an engine (one per node) and returns a `NodeFabric` that travels back to
the kernel as JSON. Everything else here is pure: it reads a `NodeFabric` and the run's choices
and returns values, so it is tested with fake sysfs/procfs trees and hand-made nodes.
The rules are those of `reference/rank-env.md`, "NCCL, InfiniBand and the network".
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from IPython.core.error import UsageError

from jupyter_dist.common.node import IBPort, NodeFabric

__all__ = [
    "DEFAULT_TOPO_CANDIDATES",
    "IBPort",
    "NodeFabric",
    "VMSize",
    "choose_interface",
    "detect_node",
    "fabric_env",
    "find_mpiexec",
    "is_rdma_vm_size",
    "parse_vm_size",
    "rdma_without_sriov",
    "read_route_interface",
    "resolve_backend",
    "transport_summary",
    "usable_ib_ports",
]

# Azure HPC images write the topology of the VM's own size under /opt/microsoft/<sku>/ at boot
# (and point /etc/nccl.conf at it); the flat /opt/microsoft/<sku>-topo.xml files of every size
# ship in the image, so those are only trusted when they are unambiguous or match the VM size.
DEFAULT_TOPO_CANDIDATES: tuple[str, ...] = (
    "/opt/microsoft/ndv5/topo.xml",
    "/opt/microsoft/ndv4/topo.xml",
    "/opt/microsoft/ncv4/topo.xml",
    "/opt/microsoft/ndv2/topo.xml",
    "/opt/microsoft/ndv5-topo.xml",
    "/opt/microsoft/ndv4-topo.xml",
    "/opt/microsoft/ncv4-topo.xml",
    "/opt/microsoft/ndv2-topo.xml",
)
VM_SIZE_ENV_VARS: tuple[str, ...] = ("JUPYTER_DIST_VM_SIZE", "AZURE_VM_SIZE")

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
# detection (runs on the node)


def read_ib_ports(sysfs_root: str = "/sys") -> tuple[IBPort, ...]:
    """Every port of every RDMA device under `<sysfs_root>/class/infiniband`."""
    base = Path(sysfs_root, "class", "infiniband")
    ports: list[IBPort] = []
    if not base.is_dir():
        return ()
    for dev in sorted(base.iterdir(), key=lambda p: p.name):
        pdir = dev / "ports"
        if not pdir.is_dir():
            continue
        for port in sorted(pdir.iterdir(), key=lambda p: _int_or(p.name, 0)):
            if not port.name.isdigit():
                continue
            raw_state = _read(port / "state") or "unknown"
            state = raw_state.split(":", 1)[-1].strip() or "unknown"  # "4: ACTIVE" -> "ACTIVE"
            link = _read(port / "link_layer") or "InfiniBand"  # kernels before link_layer: IB only
            ports.append(IBPort(dev.name, int(port.name), state, link))
    return tuple(ports)


def read_interfaces(sysfs_root: str = "/sys") -> tuple[str, ...]:
    base = Path(sysfs_root, "class", "net")
    if not base.is_dir():
        return ()
    return tuple(sorted(p.name for p in base.iterdir()))


def read_route_interface(master_addr: str, proc_root: str = "/proc") -> str | None:
    """The interface of the most specific route to `master_addr` in `<proc_root>/net/route`.

    Loopback addresses give "lo" (the kernel keeps those in the local table, not this one).
    A name that does not resolve, or an IPv6 address other than ::1, gives None.
    """
    addr = _resolve_ipv4(master_addr)
    if addr is None:
        return "lo" if _is_loopback_name(master_addr) else None
    if addr.is_loopback:
        return "lo"
    target = int(addr)
    best: tuple[int, int, str] | None = None  # (prefix length, -metric, iface)
    try:
        lines = Path(proc_root, "net", "route").read_text().splitlines()
    except OSError:
        return None
    for line in lines[1:]:
        parts = line.split()
        if len(parts) < 8:
            continue
        try:
            iface, dest, flags, metric, mask = (
                parts[0],
                _route_ip(parts[1]),
                int(parts[3], 16),
                int(parts[6]),
                _route_ip(parts[7]),
            )
        except ValueError:
            continue
        if not flags & 0x1:  # RTF_UP
            continue
        if target & mask != dest & mask:
            continue
        key = (bin(mask).count("1"), -metric, iface)
        if best is None or key[:2] > best[:2]:
            best = key
    return best[2] if best else None


def detect_gpus() -> tuple[int, tuple[str, ...]]:
    """(count torch can use, names the driver reports) without creating a CUDA context.

    The count is `torch.cuda.device_count()`, which asks NVML first (no context, fork stays
    safe) and honours CUDA_VISIBLE_DEVICES; without torch it is the number of names. Names come
    from NVML or nvidia-smi (torch's `get_device_name` would initialise CUDA and put a context
    on GPU 0 in every rank). More names than the count means torch cannot use some GPUs
    (a CPU-only build, say).
    """
    names = _nvml_names()
    if names is None:
        names = _nvidia_smi_names()
    names = _filter_visible(names or (), os.environ.get("CUDA_VISIBLE_DEVICES"))
    count = len(names)
    try:
        import torch
    except ImportError:
        return count, tuple(names)
    try:
        count = int(torch.cuda.device_count())
    except Exception:
        count = 0
    return count, tuple(names)


def find_mpiexec() -> str | None:
    """The `mpiexec` matching this environment's mpi4py: sys.prefix/bin first, then PATH."""
    local = Path(sys.prefix, "bin", "mpiexec")
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("mpiexec")


def detect_mpi(mpiexec: str | None = None) -> tuple[str | None, bool | None]:
    """("Open MPI 5.0.11 (mpiexec at /path)", has UCX pml) or (None, None) when none is found."""
    path = mpiexec or find_mpiexec()
    if not path:
        return None, None
    return _mpi_info(path)


def detect_topo_file(
    candidates: Sequence[str], vm_size: str | None, nccl_conf: str | None = "/etc/nccl.conf"
) -> tuple[str | None, tuple[str, ...]]:
    """The NCCL topology file for this VM and every candidate found.

    Order: a NCCL_TOPO_FILE in /etc/nccl.conf that exists (the image set it for this size),
    then a candidate matching the VM size's generation, then the only distinct candidate.
    """
    found = tuple(c for c in candidates if Path(c).is_file())
    if nccl_conf:
        conf = _read(Path(nccl_conf))
        for line in (conf or "").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "NCCL_TOPO_FILE" and value.strip() and Path(value.strip()).is_file():
                return value.strip(), found
    gen = _topo_generation(vm_size) if vm_size else None
    if gen:
        for c in found:
            if Path(c).parent.name == gen or Path(c).name.startswith(gen + "-"):
                return c, found
    distinct = {os.path.realpath(c) for c in found}
    if len(distinct) == 1:
        return found[0], found
    return None, found


def detect_node(
    master_addr: str,
    *,
    sysfs_root: str = "/sys",
    proc_root: str = "/proc",
    vm_size: str | None = None,
    topo_candidates: tuple[str, ...] = DEFAULT_TOPO_CANDIDATES,
    nccl_conf: str | None = "/etc/nccl.conf",
    env: Mapping[str, str] | None = None,
) -> NodeFabric:
    """Detect this node's fabric. Reads files and runs `mpiexec --version` once (cached)."""
    env = os.environ if env is None else env
    size = vm_size or next((env[k] for k in VM_SIZE_ENV_VARS if env.get(k)), None)
    gpu_count, gpu_names = detect_gpus()
    mpi, ucx = detect_mpi()
    topo, found = detect_topo_file(topo_candidates, size, nccl_conf)
    return NodeFabric(
        hostname=socket.gethostname(),
        gpu_count=gpu_count,
        gpu_names=gpu_names,
        ib_ports=read_ib_ports(sysfs_root),
        interfaces=read_interfaces(sysfs_root),
        route_interface=read_route_interface(master_addr, proc_root),
        mpi=mpi,
        topo_file=topo,
        vm_size=size,
        mpi_ucx=ucx,
        topo_files_found=found,
        cpu_count=os.cpu_count(),
    )


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
# Azure VM sizes


@dataclass(frozen=True)
class VMSize:
    """An Azure size name taken apart: Standard_ND96amsr_A100_v4 -> ND, 96, None, "amsr", ("A100",), 4."""

    family: str
    vcpus: int
    constrained_vcpus: int | None
    capabilities: str  # additive letters, lower-cased: a d i l m r s t ...
    accelerator: tuple[str, ...] = field(default=())
    version: int = 1


# Family letters come before the vCPU count, capability letters after it (Azure treats size
# names case-insensitively, and "Standard_NC40ADS_H100_V5" is seen in the wild).
_SIZE_HEAD = re.compile(r"^(?P<family>[A-Za-z]+)(?P<vcpus>\d+)(?:-(?P<constrained>\d+))?(?P<caps>[A-Za-z]*)$")


def parse_vm_size(size: str) -> VMSize | None:
    """Parse an Azure VM size name; None when it is not one."""
    name = size.strip()
    for prefix in ("Standard_", "Basic_"):
        if name.lower().startswith(prefix.lower()):
            name = name[len(prefix) :]
            break
    parts = name.split("_")
    head = _SIZE_HEAD.match(parts[0]) if parts and parts[0] else None
    if head is None:
        return None
    version, accel = 1, []
    for part in parts[1:]:
        if re.fullmatch(r"[vV]\d+", part):
            version = int(part[1:])
        elif part.lower() != "promo" and part:
            accel.append(part)
    return VMSize(
        family=head["family"].upper(),
        vcpus=int(head["vcpus"]),
        constrained_vcpus=int(head["constrained"]) if head["constrained"] else None,
        capabilities=head["caps"].lower(),
        accelerator=tuple(accel),
        version=version,
    )


def is_rdma_vm_size(size: str) -> bool | None:
    """Whether an Azure size is RDMA-capable: an "r" among the capability letters after the vCPUs.

    Standard_NC24rs_v3, Standard_ND96asr_v4, Standard_HB120rs_v3 -> True; Standard_NC24s_v3,
    Standard_D4s_v5 -> False; a name that is not an Azure size -> None.
    """
    parsed = parse_vm_size(size)
    if parsed is None:
        return None
    return "r" in parsed.capabilities


def rdma_without_sriov(size: str) -> bool:
    """RDMA sizes whose InfiniBand is not exposed through SR-IOV (NC24r, NC24rs_v2, ND24rs, H16r).

    Current images' OFED/NCCL cannot use their network; only Intel MPI over Network Direct did.
    """
    p = parse_vm_size(size)
    if p is None or "r" not in p.capabilities:
        return False
    return (p.family in ("NC", "ND") and p.version <= 2 and not p.accelerator and p.vcpus == 24) or (
        p.family == "H" and p.version == 1
    )


def _topo_generation(size: str) -> str | None:
    """The /opt/microsoft/<gen> directory name of an Azure GPU size's topology file."""
    p = parse_vm_size(size)
    if p is None:
        return None
    accel = {a.upper() for a in p.accelerator}
    if p.family == "ND" and p.version == 5:
        return "ndv5"
    if p.family == "ND" and p.version == 4:
        return "ndv4"
    if p.family == "NC" and p.version == 4 and "A100" in accel:
        return "ncv4"
    if p.family == "ND" and p.version == 2:
        return "ndv2"
    return None


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


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int_or(text: str, default: int) -> int:
    try:
        return int(text)
    except ValueError:
        return default


def _route_ip(hex_value: str) -> int:
    """A /proc/net/route address (the kernel prints the big-endian u32 in host order) as an int."""
    return int.from_bytes(struct.pack("=I", int(hex_value, 16)), "big")


def _is_loopback_name(host: str) -> bool:
    return host in ("localhost", "::1", "ip6-localhost")


def _resolve_ipv4(host: str) -> ipaddress.IPv4Address | None:
    try:
        addr = ipaddress.ip_address(host)
        return addr if isinstance(addr, ipaddress.IPv4Address) else None
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.gethostbyname(host))
    except (OSError, UnicodeError):
        return None


def _nvml_names() -> list[str] | None:
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            out = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                out.append(name.decode() if isinstance(name, bytes) else str(name))
            return out
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def _nvidia_smi_names() -> list[str] | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        res = subprocess.run(
            [exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        return None
    return [line.strip() for line in res.stdout.splitlines() if line.strip()]


def _filter_visible(names: Sequence[str], visible: str | None) -> list[str]:
    """Apply CUDA_VISIBLE_DEVICES given as indices; UUID lists are left to torch's count."""
    if visible is None:
        return list(names)
    items = [v.strip() for v in visible.split(",") if v.strip()]
    if not items or items == ["-1"]:
        return []
    out: list[str] = []
    for v in items:
        if not v.isdigit():
            return list(names)
        i = int(v)
        if i >= len(names):
            break  # CUDA stops at the first invalid index
        out.append(names[i])
    return out


@cache
def _mpi_info(path: str) -> tuple[str | None, bool | None]:
    try:
        res = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None, None
    text = (res.stdout or res.stderr).strip()
    where = f"(mpiexec at {path})"
    m = re.search(r"Open MPI\)?\s*v?(\d+(?:\.\d+)*)", text)
    if m:
        return f"Open MPI {m.group(1)} {where}", _ompi_has_ucx(Path(path).with_name("ompi_info"))
    if "Intel" in text:
        m = re.search(r"Version\s+(\S+)", text)
        return f"Intel MPI {m.group(1).rstrip(',') if m else ''} {where}".replace("  ", " "), None
    if "HYDRA" in text or "MPICH" in text:
        m = re.search(r"Version:\s*(\S+)", text)
        return f"MPICH {m.group(1) if m else ''} {where}".replace("  ", " "), None
    first = text.splitlines()[0] if text else "unknown MPI"
    return f"{first} {where}", None


def _ompi_has_ucx(ompi_info: Path) -> bool | None:
    if not ompi_info.is_file():
        return None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        res = subprocess.run([str(ompi_info), "--parsable"], capture_output=True, text=True, timeout=10)
        if res.returncode == 0:
            return "mca:pml:ucx:" in res.stdout
    return None
