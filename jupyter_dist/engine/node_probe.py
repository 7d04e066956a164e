"""What a node has: GPUs, InfiniBand ports, network interfaces, the route to the master, MPI.

Runs on the node (an engine of each node, or the kernel for its own host) and returns a
`NodeFabric` that travels to the kernel as JSON; the kernel's plan (`plan.fabric_env`) turns it
into the ranks' NCCL/UCX/MPI environment. Tested with fake sysfs/procfs trees.
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
from functools import cache
from pathlib import Path
from typing import Any

from jupyter_dist.common.hosts import source_address
from jupyter_dist.common.node import IBPort, NodeFabric
from jupyter_dist.common.ports import free_ports
from jupyter_dist.common.vm_size import topo_generation

__all__ = [
    "DEFAULT_TOPO_CANDIDATES",
    "VM_SIZE_ENV_VARS",
    "detect_gpus",
    "detect_mpi",
    "detect_node",
    "detect_node_json",
    "detect_topo_file",
    "find_mpiexec",
    "node_view",
    "read_ib_ports",
    "read_interfaces",
    "read_route_interface",
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


# ---------------------------------------------------------------------------------------------
# detection


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
    no_driver = names is None and not os.path.exists("/dev/kfd")  # no NVIDIA driver; no ROCm device either
    names = _filter_visible(names or (), os.environ.get("CUDA_VISIBLE_DEVICES"))
    count = len(names)
    if no_driver:
        # torch could use no GPU here: not imported for nothing (1-2 s of a cold first cell)
        return 0, ()
    try:
        import torch  # heavy and optional: its count honours what this process may use
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
    gen = topo_generation(vm_size) if vm_size else None
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


def node_view(toward: str, master_addr: str | None, nports: int) -> dict[str, Any]:
    """This node's address toward `toward` (the controller for node 0, node 0 for the others),
    its fabric as seen toward the master, and `nports` + 1 ports free on that address.

    Run on a node's first engine once the engines are up (`cluster.hosts.node_plan` reads it).
    """
    addr = source_address(toward)
    fab = detect_node(master_addr or addr)
    return {"addr": addr, "fabric": fab.to_json(), "ports": list(free_ports(nports + 1, addr)),
            "host": socket.gethostname()}


def detect_node_json(master_addr: str) -> dict[str, Any]:
    """`detect_node(master_addr)` as JSON: what the kernel asks a node's engine for."""
    return detect_node(master_addr).to_json()


# ---------------------------------------------------------------------------------------------
# helpers


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
        import pynvml  # type: ignore[import-not-found]  # optional: NVML names without a CUDA context
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
