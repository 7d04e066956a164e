"""Azure VM size names taken apart: RDMA capability and the NCCL topology file's generation.

Pure and stdlib only: the plan (which InfiniBand ports are real RDMA) and a node's detection
(which topology file fits this VM) both read it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["VMSize", "is_rdma_vm_size", "parse_vm_size", "rdma_without_sriov", "topo_generation"]


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


def topo_generation(size: str) -> str | None:
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
