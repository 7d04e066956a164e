"""doctor.build_report: rows and warnings from hand-made and fake-tree nodes."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

from nodes import ACTIVE, DOWN, ROCE, node

from jupyter_dist.common.node import IBPort, NodeFabric
from jupyter_dist.engine import node_probe
from jupyter_dist.engine.node_probe import detect_node
from jupyter_dist.tools.doctor import COLUMNS, build_report


def make_sysfs(root: Path, ib: dict[str, dict[int, str]]) -> None:
    (root / "class" / "net" / "eth0").mkdir(parents=True)
    (root / "class" / "net" / "lo").mkdir(parents=True)
    for dev, ports in ib.items():
        for port, state in ports.items():
            pdir = root / "class" / "infiniband" / dev / "ports" / str(port)
            pdir.mkdir(parents=True)
            (pdir / "state").write_text({"ACTIVE": "4: ACTIVE", "DOWN": "1: DOWN"}[state] + "\n")
            (pdir / "link_layer").write_text("InfiniBand\n")


def make_route(proc: Path, routes: list[tuple[str, str, str]]) -> None:
    """routes: (iface, destination, mask), all up."""

    def hexip(dotted: str) -> str:
        return f"{struct.unpack('=I', socket.inet_aton(dotted))[0]:08X}"

    (proc / "net").mkdir(parents=True)
    lines = ["Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"]
    lines += [f"{i}\t{hexip(d)}\t00000000\t0001\t0\t0\t0\t{hexip(m)}\t0\t0\t0" for i, d, m in routes]
    (proc / "net" / "route").write_text("\n".join(lines) + "\n")


def report(nodes, **kw):
    args = dict(
        procs_per_node=2,
        nodes_requested=len(nodes),
        backend="auto",
        ib="auto",
        kernel_env={},
        master_addr="10.0.0.4",
    )
    args.update(kw)
    return build_report(nodes, **args)


def two_hosts(**kw) -> list[NodeFabric]:
    return [node(hostname="a", **kw), node(hostname="b", **kw)]


def has(warnings: list[str], text: str) -> bool:
    return any(text in w for w in warnings)


def test_single_local_node_cpu_only():
    r = report([node(hostname="laptop")], master_addr="127.0.0.1")
    assert r.backend == "gloo"
    assert r.notes == ["--backend auto: no CUDA GPUs found: using gloo"]
    assert r.warnings == []
    assert len(r.rows) == 1 and tuple(r.rows[0]) == COLUMNS
    row = r.rows[0]
    assert row["GPUs"] == "0" and row["InfiniBand"] == "none" and row["interface"] == "lo (route: eth0)"
    assert row["MPI"].startswith("Open MPI 5") and row["transport"] == "gloo over TCP (lo)"
    assert r.env[0]["GLOO_SOCKET_IFNAME"] == "lo"
    text = r.to_text()
    assert "laptop" in text and "no warnings" in text and "transport: gloo over TCP (lo)" in text


def test_more_processes_than_gpus():
    r = report([node(gpu_count=2, gpu_names=("NVIDIA A100",) * 2)], procs_per_node=4, master_addr="127.0.0.1")
    assert r.backend == "gloo" and "2 CUDA GPUs for 4 processes" in r.notes[0]
    assert has(r.warnings, "runs 4 processes per node but has only 2 GPUs")
    assert r.rows[0]["GPUs"] == "2 x NVIDIA A100"


def test_nccl_requested_without_gpus_becomes_warning():
    r = report([node()], backend="nccl", master_addr="127.0.0.1")
    assert "--backend nccl needs at least 2 CUDA GPUs per node, but this node has 0." in r.warnings
    assert r.backend == "gloo"


def test_gpus_torch_cannot_use():
    r = report([node(gpu_count=0, gpu_names=("NVIDIA H200",))], procs_per_node=1, master_addr="127.0.0.1")
    assert has(r.warnings, "the driver reports 1 GPUs but torch can use 0")
    assert "seen by the driver" in r.rows[0]["GPUs"]


def test_multi_node_without_infiniband():
    r = report(two_hosts(gpu_count=2))
    assert r.backend == "nccl"
    assert has(r.warnings, "Node 0 (a): it has no active InfiniBand port")
    assert has(r.warnings, "expect sub-linear scaling")
    assert r.transport == "NCCL over sockets (eth0)"
    assert r.env[1]["NCCL_IB_DISABLE"] == "1"


def test_multi_node_with_down_port():
    r = report(two_hosts(gpu_count=2, ib_ports=DOWN))
    assert has(r.warnings, "expect sub-linear scaling")
    assert r.rows[0]["InfiniBand"] == "mlx5_0:1 DOWN (IB)"


def test_multi_node_with_infiniband():
    r = report(two_hosts(gpu_count=2, ib_ports=ACTIVE))
    assert not has(r.warnings, "sub-linear")
    assert r.transport == "NCCL over InfiniBand (mlx5_0:1)"
    assert r.rows[0]["InfiniBand"] == "mlx5_0:1 ACTIVE (IB)"
    assert r.env[0]["NCCL_IB_HCA"] == "mlx5_0"


def test_multi_node_roce():
    r = report(two_hosts(gpu_count=2, ib_ports=ROCE))
    assert not has(r.warnings, "sub-linear")
    assert r.transport == "NCCL over RoCE (mlx5_0:1)"
    assert r.rows[0]["InfiniBand"] == "mlx5_0:1 ACTIVE (RoCE)"


def test_ib_off_multi_node():
    r = report(two_hosts(gpu_count=2, ib_ports=ACTIVE), ib="off")
    assert has(r.warnings, "InfiniBand is turned off (--ib off)")


def test_ib_on_without_port_becomes_warning():
    r = report([node(hostname="x")], ib="on", master_addr="127.0.0.1")
    assert "--ib on needs an ACTIVE InfiniBand port, but x has no InfiniBand device." in r.warnings


def test_virtual_nodes_on_one_host_are_not_multi_node():
    r = report([node(hostname="h"), node(hostname="h")], master_addr="127.0.0.1")
    assert not has(r.warnings, "sub-linear")
    assert r.rows[1]["interface"].startswith("lo")


def test_slurm_ntasks_in_kernel_env():
    r = report([node()], kernel_env={"SLURM_NTASKS": "4"}, master_addr="127.0.0.1")
    assert has(
        r.warnings,
        "SLURM_NTASKS=4 is set in the kernel's environment: Lightning will think it runs under Slurm",
    )
    assert not has(
        report([node()], kernel_env={"SLURM_NTASKS": "4"}, launcher="slurm").warnings, "SLURM_NTASKS"
    )


def test_user_disabled_ib_with_ib_present():
    r = report([node(gpu_count=2, ib_ports=ACTIVE)], kernel_env={"NCCL_IB_DISABLE": "1"})
    assert has(
        r.warnings,
        "NCCL_IB_DISABLE=1 is set in the kernel's environment although Node 0 (n0) has active InfiniBand",
    )
    assert not has(
        report([node(ib_ports=ACTIVE)], kernel_env={"NCCL_IB_DISABLE": "0"}).warnings, "NCCL_IB_DISABLE"
    )
    assert not has(report([node()], kernel_env={"NCCL_IB_DISABLE": "1"}).warnings, "NCCL_IB_DISABLE")


def test_vm_size_not_rdma_multi_node():
    r = report(two_hosts(gpu_count=2, vm_size="Standard_NC24s_v3"))
    assert has(r.warnings, "Standard_NC24s_v3, which is not RDMA-capable")
    assert r.rows[0]["VM size"] == "Standard_NC24s_v3 (no RDMA)"
    # single node: the size does not matter
    assert not has(report([node(vm_size="Standard_NC24s_v3")]).warnings, "RDMA")


def test_vm_size_rdma_but_no_active_port():
    r = report(two_hosts(gpu_count=2, vm_size="Standard_NC24rs_v3"))
    assert has(r.warnings, "an RDMA-capable size, but no InfiniBand port is ACTIVE")
    assert r.rows[0]["VM size"] == "Standard_NC24rs_v3 (RDMA)"


def test_vm_size_rdma_without_sriov():
    r = report(two_hosts(gpu_count=4, vm_size="Standard_NC24r"), procs_per_node=4)
    assert has(r.warnings, "RDMA-capable but without SR-IOV")
    assert r.rows[0]["VM size"] == "Standard_NC24r (RDMA, no SR-IOV)"


def test_azure_accelerated_networking_row():
    an = (IBPort("mlx5_an0", 1, "ACTIVE", "Ethernet"),)
    r = report([node(ib_ports=an)])
    assert r.rows[0]["InfiniBand"] == "mlx5_an0:1 ACTIVE (Ethernet NIC, not RDMA)"


def test_missing_nodes_and_mixed_gpus():
    r = report([node(hostname="a", gpu_count=2), node(hostname="b", gpu_count=1)], nodes_requested=3)
    assert has(r.warnings, "3 nodes were requested but only 2 reported back")
    assert has(r.warnings, "different numbers of GPUs")
    assert has(r.warnings, "--backend auto") is False  # the fallback is a note, not a warning
    assert r.notes and "1 CUDA GPU for 2 processes" in r.notes[0]


def test_html_escapes():
    r = report([node(hostname="<b>x</b>")], kernel_env={"SLURM_NTASKS": "2"})
    out = r.to_html()
    assert "<table" in out and "&lt;b&gt;x&lt;/b&gt;" in out and "<b>x</b>" not in out
    assert out.count("<li>") == len(r.warnings) >= 1


def test_report_from_fake_trees(tmp_path, monkeypatch):
    """detect_node on fake sysfs/procfs trees -> build_report: the whole doctor path without engines."""
    monkeypatch.setattr(node_probe, "detect_gpus", lambda: (2, ("NVIDIA A100",) * 2))
    monkeypatch.setattr(node_probe, "detect_mpi", lambda: ("Open MPI 5.0.11 (mpiexec at /x)", True))
    nodes = []
    routes = [("eth0", "0.0.0.0", "0.0.0.0"), ("ib0", "10.1.0.0", "255.255.0.0")]
    for host, state in [("a", "ACTIVE"), ("b", "DOWN")]:
        root = tmp_path / host
        make_sysfs(root / "sys", {"mlx5_0": {1: state}})
        make_route(root / "proc", routes)
        monkeypatch.setattr(socket, "gethostname", lambda h=host: h)
        nodes.append(
            detect_node(
                "10.1.0.4",
                sysfs_root=str(root / "sys"),
                proc_root=str(root / "proc"),
                topo_candidates=(),
                env={},
            )
        )
    r = report(nodes, master_addr="10.1.0.4")
    assert [row["host"] for row in r.rows] == ["a", "b"]
    assert r.rows[0]["transport"] == "NCCL over InfiniBand (mlx5_0:1)"
    assert r.rows[1]["transport"] == "NCCL over sockets (ib0)"  # the route to the master: IPoIB
    assert has(r.warnings, "Node 1 (b): it has no active InfiniBand port")
    assert not has(r.warnings, "Node 0 (a): it has no active")
