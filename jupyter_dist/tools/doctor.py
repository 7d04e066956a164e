"""`%dist doctor`: a per-node table of what was detected and warnings in plain words. Pure."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from IPython.core.error import UsageError

from jupyter_dist.common.vm_size import is_rdma_vm_size, rdma_without_sriov
from jupyter_dist.plan.fabric_env import (
    NodeFabric,
    choose_interface,
    fabric_env,
    resolve_backend,
    transport_summary,
    usable_ib_ports,
)

__all__ = ["COLUMNS", "DoctorReport", "build_report"]

COLUMNS: tuple[str, ...] = (
    "node",
    "host",
    "GPUs",
    "InfiniBand",
    "interface",
    "MPI",
    "VM size",
    "topology file",
    "transport",
)


@dataclass(frozen=True)
class DoctorReport:
    rows: list[dict[str, str]]  # one per node, keys COLUMNS
    warnings: list[str]
    backend: str  # the backend the run would use
    transport: str  # node 0's transport line
    notes: list[str] = field(default_factory=list)  # informational lines (backend fallback, ...)
    env: list[dict[str, str]] = field(default_factory=list)  # per node: the fabric environment

    def to_text(self) -> str:
        widths = {c: max(len(c), *(len(r[c]) for r in self.rows)) if self.rows else len(c) for c in COLUMNS}
        lines = [
            "  ".join(c.ljust(widths[c]) for c in COLUMNS).rstrip(),
            "  ".join("-" * widths[c] for c in COLUMNS),
        ]
        lines += ["  ".join(r[c].ljust(widths[c]) for c in COLUMNS).rstrip() for r in self.rows]
        lines.append("")
        lines.append(f"backend: {self.backend}; transport: {self.transport}")
        lines += [f"note: {n}" for n in self.notes]
        if self.warnings:
            lines.append("warnings:")
            lines += [f"  - {w}" for w in self.warnings]
        else:
            lines.append("no warnings")
        return "\n".join(lines)

    def to_html(self) -> str:
        e = html.escape
        out = ['<table class="jupyter-dist-doctor">', "<thead><tr>"]
        out += [f"<th>{e(c)}</th>" for c in COLUMNS]
        out.append("</tr></thead><tbody>")
        for r in self.rows:
            out.append("<tr>" + "".join(f"<td>{e(r[c])}</td>" for c in COLUMNS) + "</tr>")
        out.append("</tbody></table>")
        out.append(f"<p><b>backend</b>: {e(self.backend)}; <b>transport</b>: {e(self.transport)}</p>")
        for n in self.notes:
            out.append(f"<p>{e(n)}</p>")
        if self.warnings:
            out.append('<ul class="jupyter-dist-warnings">')
            out += [f"<li>&#9888; {e(w)}</li>" for w in self.warnings]
            out.append("</ul>")
        else:
            out.append("<p>No warnings.</p>")
        return "\n".join(out)

    def _repr_html_(self) -> str:
        return self.to_html()

    def __str__(self) -> str:
        return self.to_text()


def build_report(
    nodes: Sequence[NodeFabric],
    *,
    procs_per_node: int,
    nodes_requested: int,
    backend: str,
    ib: str,
    kernel_env: Mapping[str, str],
    master_addr: str,
    all_local: bool | None = None,
    launcher: str | None = None,
    nccl_debug: bool = False,
) -> DoctorReport:
    """The doctor report for `nodes` (one NodeFabric per node, node 0 first).

    `backend` is the requested one (auto, nccl, gloo, mpi); `all_local` defaults to "every node
    is the same host". Problems that would stop a run (nccl without GPUs, --ib on without an
    active port) become warnings here, worded as the run would word them.
    """
    hosts = {n.hostname for n in nodes}
    local = len(hosts) <= 1 if all_local is None else all_local
    multi_host = not local and nodes_requested > 1
    warnings: list[str] = []
    notes: list[str] = []

    min_gpus = min((n.gpu_count for n in nodes), default=0)
    try:
        resolved, why = resolve_backend(backend, min_gpus, procs_per_node, where=_where_gpus(nodes, min_gpus))
        if why:
            notes.append(f"--backend {backend}: {why}")
    except UsageError as err:
        warnings.append(str(err))
        resolved = "gloo"

    rows: list[dict[str, str]] = []
    envs: list[dict[str, str]] = []
    for i, node in enumerate(nodes):
        iface = choose_interface(node, master_addr, local)
        try:
            env = fabric_env(
                node,
                backend=resolved,
                ib=ib,
                nccl_debug=nccl_debug,
                master_addr=master_addr,
                all_local=local,
            )
        except UsageError as err:
            warnings.append(str(err))
            env = fabric_env(
                node,
                backend=resolved,
                ib="off",
                nccl_debug=nccl_debug,
                master_addr=master_addr,
                all_local=local,
            )
        envs.append(env)
        rows.append(
            {
                "node": str(i),
                "host": node.hostname,
                "GPUs": _gpu_words(node),
                "InfiniBand": _ib_words(node),
                "interface": _iface_words(node, iface),
                "MPI": node.mpi or "none found",
                "VM size": _size_words(node.vm_size),
                "topology file": node.topo_file or "none",
                "transport": transport_summary(
                    node, resolved, ib, interface=iface, single_node=(nodes_requested <= 1 or local)
                ),
            }
        )
        warnings += _node_warnings(i, node, procs_per_node, ib, iface, multi_host, kernel_env)

    if nodes_requested > 1 and not local and len(nodes) < nodes_requested:
        warnings.append(f"{nodes_requested} nodes were requested but only {len(nodes)} reported back.")
    if len({n.gpu_count for n in nodes}) > 1:
        counts = ", ".join(f"node {i}: {n.gpu_count}" for i, n in enumerate(nodes))
        warnings.append(
            f"The nodes have different numbers of GPUs ({counts}); every node runs the same number of ranks."
        )
    ntasks = kernel_env.get("SLURM_NTASKS")
    if ntasks is not None and launcher != "slurm":
        warnings.append(
            f"SLURM_NTASKS={ntasks} is set in the kernel's environment: Lightning will think it runs under Slurm "
            "and take its ranks from Slurm; unset it (del os.environ['SLURM_NTASKS']) unless the engines run "
            "as a Slurm job."
        )
    return DoctorReport(
        rows=rows,
        warnings=_unique(warnings),
        backend=resolved,
        transport=rows[0]["transport"] if rows else "unknown",
        notes=notes,
        env=envs,
    )


def _node_warnings(
    i: int,
    node: NodeFabric,
    procs: int,
    ib: str,
    iface: str | None,
    multi_host: bool,
    kernel_env: Mapping[str, str],
) -> list[str]:
    who = f"Node {i} ({node.hostname})"
    out: list[str] = []
    ports = () if ib == "off" else usable_ib_ports(node)
    if node.gpu_count > 0 and procs > node.gpu_count:
        gpus = f"{node.gpu_count} GPU{'' if node.gpu_count == 1 else 's'}"
        out.append(
            f"{who} runs {procs} processes per node but has only {gpus}: ranks would have to share GPUs, "
            f"which NCCL does not allow; use -n {node.gpu_count} to give each rank its own GPU."
        )
    if len(node.gpu_names) > node.gpu_count:
        out.append(
            f"{who}: the driver reports {len(node.gpu_names)} GPUs but torch can use {node.gpu_count} "
            "(a CPU-only torch build, or CUDA_VISIBLE_DEVICES)."
        )
    if multi_host and not ports:
        reason = "InfiniBand is turned off (--ib off)" if ib == "off" else "it has no active InfiniBand port"
        out.append(
            f"{who}: {reason}, so traffic between nodes goes over TCP sockets"
            f"{f' ({iface})' if iface else ''}; expect sub-linear scaling."
        )
    if ports and _truthy(kernel_env.get("NCCL_IB_DISABLE")):
        out.append(
            f"NCCL_IB_DISABLE={kernel_env['NCCL_IB_DISABLE']} is set in the kernel's environment although "
            f"{who} has active InfiniBand ({', '.join(p.name for p in ports)}): NCCL will use sockets "
            "instead; unset it to use InfiniBand."
        )
    if node.vm_size:
        rdma = is_rdma_vm_size(node.vm_size)
        if rdma is False and multi_host:
            out.append(
                f"{who} is a {node.vm_size}, which is not RDMA-capable (no 'r' in the size): there is no "
                "InfiniBand between nodes; for multi-node training pick an RDMA size (one with 'r', e.g. "
                "Standard_NC24rs_v3, Standard_ND96asr_v4)."
            )
        elif rdma and rdma_without_sriov(node.vm_size):
            out.append(
                f"{who} is a {node.vm_size}: RDMA-capable but without SR-IOV, so InfiniBand is not available "
                "to NCCL or UCX on current images."
            )
        elif rdma and not ports and ib != "off":
            out.append(
                f"{who} is a {node.vm_size}, an RDMA-capable size, but no InfiniBand port is ACTIVE: check the "
                "InfiniBand driver (an Azure HPC image has it) and `ibstat`."
            )
    if ports and node.mpi and "Open MPI" in node.mpi and node.mpi_ucx is False:
        out.append(f"{who}: this Open MPI has no UCX, so MPI traffic goes over TCP, not InfiniBand.")
    if node.topo_file is None and len(node.topo_files_found) > 1:
        out.append(
            f"{who} has several NCCL topology files ({', '.join(node.topo_files_found)}) and its VM size is "
            "unknown: set JUPYTER_DIST_VM_SIZE, or --env NCCL_TOPO_FILE=<file>."
        )
    if multi_host and iface is None:
        out.append(
            f"{who}: no network interface routes to the master address; set --env NCCL_SOCKET_IFNAME=<name>."
        )
    elif multi_host and node.route_interface == "docker0":
        out.append(f"{who}: the route to the master goes through docker0; using {iface} instead.")
    return out


def _gpu_words(node: NodeFabric) -> str:
    if node.gpu_count == 0 and not node.gpu_names:
        return "0"
    names = node.gpu_names[: node.gpu_count] if node.gpu_count else node.gpu_names
    if names and len(set(names)) == 1:
        desc = f"{node.gpu_count} x {names[0]}"
    elif names:
        desc = f"{node.gpu_count}: {', '.join(names)}"
    else:
        desc = str(node.gpu_count)
    if len(node.gpu_names) > node.gpu_count:
        desc += f" ({len(node.gpu_names)} seen by the driver)"
    return desc


def _ib_words(node: NodeFabric) -> str:
    if not node.ib_ports:
        return "none"
    usable = set(usable_ib_ports(node))
    parts = []
    for p in node.ib_ports:
        if p.link_layer.lower() != "ethernet":
            layer = "IB"
        elif p in usable or not p.active:
            layer = "RoCE"
        else:
            layer = "Ethernet NIC, not RDMA"  # Azure accelerated networking, or a non-RDMA size
        parts.append(f"{p.name} {p.state} ({layer})")
    return "; ".join(parts)


def _iface_words(node: NodeFabric, iface: str | None) -> str:
    if iface is None:
        return "none found"
    if node.route_interface and node.route_interface != iface:
        return f"{iface} (route: {node.route_interface})"
    return iface


def _size_words(size: str | None) -> str:
    if not size:
        return "unknown"
    rdma = is_rdma_vm_size(size)
    if rdma is None:
        return size
    if rdma and rdma_without_sriov(size):
        return f"{size} (RDMA, no SR-IOV)"
    return f"{size} ({'RDMA' if rdma else 'no RDMA'})"


def _where_gpus(nodes: Sequence[NodeFabric], min_gpus: int) -> str:
    if len(nodes) <= 1:
        return "this node"
    i = next((k for k, n in enumerate(nodes) if n.gpu_count == min_gpus), 0)
    return f"node {i} ({nodes[i].hostname})"


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in ("", "0", "false", "no", "off")


def _unique(items: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for item in items:
        seen.setdefault(item, None)
    return list(seen)
