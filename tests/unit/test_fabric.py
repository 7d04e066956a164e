"""engine.node_probe against fake sysfs/procfs trees; plan.fabric_env and common.vm_size with hand-made nodes."""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import sys
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from nodes import ACTIVE, DOWN, ROCE, node

from jupyter_dist.common.vm_size import is_rdma_vm_size, parse_vm_size, rdma_without_sriov, topo_generation
from jupyter_dist.engine import node_probe
from jupyter_dist.engine.node_probe import detect_node, detect_topo_file, read_ib_ports, read_route_interface
from jupyter_dist.plan.fabric_env import (
    IBPort,
    NodeFabric,
    choose_interface,
    fabric_env,
    nccl_ib_hca,
    resolve_backend,
    transport_summary,
    usable_ib_ports,
)

# ---------------------------------------------------------------------------------------------
# fake trees


def make_sysfs(
    root: Path, ib: dict[str, dict[int, tuple[str, str]]] | None = None, net=("eth0", "lo")
) -> Path:
    """<root>/class/infiniband/<dev>/ports/<p>/{state,link_layer} and <root>/class/net/<iface>."""
    for name in net:
        (root / "class" / "net" / name).mkdir(parents=True)
    for dev, ports in (ib or {}).items():
        for port, (state, link) in ports.items():
            pdir = root / "class" / "infiniband" / dev / "ports" / str(port)
            pdir.mkdir(parents=True)
            code = {"ACTIVE": 4, "DOWN": 1, "INIT": 2}.get(state, 0)
            (pdir / "state").write_text(f"{code}: {state}\n")
            (pdir / "link_layer").write_text(f"{link}\n")
    return root


def hexip(dotted: str) -> str:
    """An IPv4 address the way /proc/net/route prints it (the big-endian u32 read natively)."""
    return f"{struct.unpack('=I', socket.inet_aton(dotted))[0]:08X}"


def make_route(proc: Path, routes: list[tuple[str, str, str, int, int]]) -> Path:
    """routes: (iface, destination, mask, flags, metric)."""
    (proc / "net").mkdir(parents=True, exist_ok=True)
    lines = ["Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"]
    for iface, dest, mask, flags, metric in routes:
        lines.append(f"{iface}\t{hexip(dest)}\t00000000\t{flags:04X}\t0\t0\t{metric}\t{hexip(mask)}\t0\t0\t0")
    (proc / "net" / "route").write_text("\n".join(lines) + "\n")
    return proc


ROUTES = [
    ("eth0", "0.0.0.0", "0.0.0.0", 0x3, 100),  # default
    ("eth1", "10.0.0.0", "255.0.0.0", 0x1, 0),
    ("ib0", "10.1.0.0", "255.255.0.0", 0x1, 0),
    ("docker0", "172.17.0.0", "255.255.0.0", 0x1, 0),
    ("eth9", "10.1.2.0", "255.255.255.0", 0x0, 0),  # not up: ignored
]






def env_of(n: NodeFabric, **kw) -> dict[str, str]:
    args = dict(backend="nccl", ib="auto", nccl_debug=False, master_addr="10.0.0.4", all_local=False)
    args.update(kw)
    return fabric_env(n, **args)


# ---------------------------------------------------------------------------------------------
# sysfs


def test_no_infiniband_tree(tmp_path):
    root = make_sysfs(tmp_path)
    assert read_ib_ports(str(root)) == ()
    assert node_probe.read_interfaces(str(root)) == ("eth0", "lo")


def test_one_active_port_and_state_parsing(tmp_path):
    root = make_sysfs(tmp_path, {"mlx5_0": {1: ("ACTIVE", "InfiniBand")}})
    assert read_ib_ports(str(root)) == ACTIVE


def test_down_and_roce_ports(tmp_path):
    root = make_sysfs(
        tmp_path, {"mlx5_0": {1: ("DOWN", "InfiniBand")}, "mlx5_1": {1: ("ACTIVE", "Ethernet")}}
    )
    ports = read_ib_ports(str(root))
    assert ports == (IBPort("mlx5_0", 1, "DOWN", "InfiniBand"), IBPort("mlx5_1", 1, "ACTIVE", "Ethernet"))
    assert [p.active for p in ports] == [False, True]


def test_detect_node_on_fake_trees_round_trips_json(tmp_path, monkeypatch):
    sysfs = make_sysfs(
        tmp_path / "sys", {"mlx5_0": {1: ("ACTIVE", "InfiniBand")}}, net=("docker0", "eth0", "ib0", "lo")
    )
    proc = make_route(tmp_path / "proc", ROUTES)
    topo = tmp_path / "ndv4" / "topo.xml"
    topo.parent.mkdir()
    topo.write_text("<system/>")
    monkeypatch.setattr(node_probe, "detect_gpus", lambda: (8, ("NVIDIA A100-SXM4-40GB",) * 8))
    monkeypatch.setattr(node_probe, "detect_mpi", lambda: ("Open MPI 4.1.5 (mpiexec at /opt/bin/mpiexec)", True))
    monkeypatch.setattr(socket, "gethostname", lambda: "nd-0")
    n = detect_node(
        "10.1.0.9",
        sysfs_root=str(sysfs),
        proc_root=str(proc),
        topo_candidates=(str(topo),),
        nccl_conf=None,
        env={"JUPYTER_DIST_VM_SIZE": "Standard_ND96asr_v4"},
    )
    assert n.hostname == "nd-0" and n.gpu_count == 8
    assert n.ib_ports == ACTIVE
    assert n.interfaces == ("docker0", "eth0", "ib0", "lo")
    assert n.route_interface == "ib0"
    assert n.topo_file == str(topo)
    assert n.vm_size == "Standard_ND96asr_v4"
    assert NodeFabric.from_json(json.loads(json.dumps(n.to_json()))) == n
    # an explicit vm_size wins over the environment
    again = detect_node(
        "10.1.0.9", sysfs_root=str(sysfs), proc_root=str(proc), topo_candidates=(), vm_size="X", env={}
    )
    assert again.vm_size == "X" and again.topo_file is None


def test_from_json_ignores_unknown_keys():
    d = node(ib_ports=ACTIVE).to_json()
    d["from_a_newer_version"] = 1
    assert NodeFabric.from_json(d) == node(ib_ports=ACTIVE)


# ---------------------------------------------------------------------------------------------
# routes and interfaces


@pytest.mark.parametrize(
    ("addr", "iface"),
    [
        ("10.1.2.3", "ib0"),  # /16 beats /8 and the default; the down /24 is ignored
        ("10.2.3.4", "eth1"),
        ("8.8.8.8", "eth0"),  # default route
        ("172.17.0.5", "docker0"),  # what the table says; choose_interface refuses it
        ("127.0.0.1", "lo"),
        ("127.3.4.5", "lo"),
        ("localhost", "lo"),
    ],
)
def test_route_interface(tmp_path, addr, iface):
    proc = make_route(tmp_path, ROUTES)
    assert read_route_interface(addr, str(proc)) == iface


def test_route_interface_without_table_or_match(tmp_path):
    assert read_route_interface("10.0.0.1", str(tmp_path)) is None
    proc = make_route(tmp_path, [("eth1", "10.0.0.0", "255.0.0.0", 0x1, 0)])
    assert read_route_interface("192.168.1.1", str(proc)) is None


def test_route_lower_metric_wins_on_equal_prefix(tmp_path):
    proc = make_route(
        tmp_path, [("eth1", "0.0.0.0", "0.0.0.0", 3, 200), ("eth0", "0.0.0.0", "0.0.0.0", 3, 100)]
    )
    assert read_route_interface("8.8.8.8", str(proc)) == "eth0"


def test_choose_interface_rules():
    n = node(interfaces=("docker0", "eth0", "lo"), route_interface="docker0")
    assert choose_interface(n, "172.17.0.2", all_local=False) == "eth0"  # never docker0
    assert choose_interface(node(route_interface="ib0"), "10.1.0.1", all_local=False) == "ib0"
    assert choose_interface(node(), "127.0.0.1", all_local=True) == "lo"
    # lo only when every node is this host
    assert choose_interface(node(route_interface="lo"), "127.0.0.1", all_local=False) == "eth0"
    assert (
        choose_interface(node(interfaces=("docker0", "lo"), route_interface=None), "10.0.0.1", False) is None
    )
    # fallback prefers a physical-looking name over ifb/veth
    n = node(interfaces=("ifb0", "lo", "veth12", "wlp2s0", "ens5"), route_interface=None)
    assert choose_interface(n, "10.0.0.1", False) == "ens5"


def test_choose_interface_from_fake_route_table(tmp_path, monkeypatch):
    proc = make_route(tmp_path / "proc", ROUTES)
    sysfs = make_sysfs(tmp_path / "sys", net=("docker0", "eth0", "eth1", "ib0", "lo"))
    monkeypatch.setattr(node_probe, "detect_gpus", lambda: (0, ()))
    monkeypatch.setattr(node_probe, "detect_mpi", lambda: (None, None))
    for addr, want in [("10.1.0.7", "ib0"), ("172.17.0.3", "eth0"), ("8.8.4.4", "eth0")]:
        n = detect_node(addr, sysfs_root=str(sysfs), proc_root=str(proc), topo_candidates=(), env={})
        assert choose_interface(n, addr, all_local=False) == want


# ---------------------------------------------------------------------------------------------
# the environment


def test_env_no_infiniband_open_mpi5():
    env = env_of(node(gpu_count=2))
    assert env == {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "NCCL_IB_DISABLE": "1",
        "UCX_TLS": "tcp",
        "OMPI_MCA_pml": "ob1",
        "OMPI_MCA_btl": "self,tcp,sm",
        "NCCL_SOCKET_IFNAME": "eth0",
        "GLOO_SOCKET_IFNAME": "eth0",
        "OMPI_MCA_btl_tcp_if_include": "eth0",
    }


def test_env_no_infiniband_open_mpi4_and_override():
    assert (
        env_of(node(mpi="Open MPI 4.1.5 (mpiexec at /usr/bin/mpiexec)"))["OMPI_MCA_btl"] == "self,tcp,vader"
    )
    assert env_of(node(), mpi_impl="openmpi4")["OMPI_MCA_btl"] == "self,tcp,vader"
    mpich = env_of(node(mpi="MPICH 4.1.2 (mpiexec at /usr/bin/mpiexec)"))
    assert not [k for k in mpich if k.startswith("OMPI_")]
    assert mpich["UCX_TLS"] == "tcp"


def test_env_gloo_cpu_all_local():
    env = env_of(node(), backend="gloo", master_addr="127.0.0.1", all_local=True)
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and env["NCCL_SOCKET_IFNAME"] == "lo"
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in env
    assert "NCCL_IB_DISABLE" not in env  # NCCL cannot run: no GPUs, not nccl
    assert "OMPI_MCA_btl_tcp_if_include" not in env


def test_env_one_active_port():
    env = env_of(node(gpu_count=8, ib_ports=ACTIVE, topo_file="/opt/microsoft/ndv4/topo.xml"))
    assert env["NCCL_IB_DISABLE"] == "0"
    assert env["NCCL_IB_HCA"] == "mlx5_0"
    assert env["NCCL_IB_PCI_RELAXED_ORDERING"] == "1"
    assert env["OMPI_MCA_pml"] == "ucx"
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1"
    assert env["NCCL_TOPO_FILE"] == "/opt/microsoft/ndv4/topo.xml"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert "UCX_TLS" not in env and "OMPI_MCA_btl" not in env


def test_env_open_mpi_without_ucx_keeps_its_pml():
    env = env_of(node(gpu_count=1, ib_ports=ACTIVE, mpi_ucx=False))
    assert "OMPI_MCA_pml" not in env and env["NCCL_IB_DISABLE"] == "0"


def test_env_down_port_is_no_infiniband():
    env = env_of(node(gpu_count=1, ib_ports=DOWN))
    assert env["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in env and env["OMPI_MCA_pml"] == "ob1"


def test_env_roce_is_rdma():
    env = env_of(node(gpu_count=1, ib_ports=ROCE))
    assert env["NCCL_IB_DISABLE"] == "0" and env["UCX_NET_DEVICES"] == "mlx5_0:1"


def test_azure_accelerated_networking_is_not_rdma():
    an = (IBPort("mlx5_an0", 1, "ACTIVE", "Ethernet"),)
    assert usable_ib_ports(node(ib_ports=an)) == ()
    # an Ethernet-layer mlx5 on a known non-RDMA size is the VM's NIC, not RoCE
    assert usable_ib_ports(node(ib_ports=ROCE, vm_size="Standard_NC24s_v3")) == ()
    assert usable_ib_ports(node(ib_ports=ROCE, vm_size="Standard_NC24rs_v3")) == ROCE


def test_env_ib_off_with_active_port():
    env = env_of(node(gpu_count=1, ib_ports=ACTIVE), ib="off")
    assert env["NCCL_IB_DISABLE"] == "1" and "UCX_NET_DEVICES" not in env


def test_ib_on_without_active_port_is_one_sentence():
    with pytest.raises(UsageError) as err:
        env_of(node(hostname="n7", ib_ports=DOWN), ib="on")
    assert str(err.value) == "--ib on needs an ACTIVE InfiniBand port, but n7 has only mlx5_0:1 DOWN."
    with pytest.raises(UsageError, match=r"^--ib on needs .* but n0 has no InfiniBand device\.$"):
        env_of(node(), ib="on")
    with pytest.raises(UsageError, match="--ib"):
        env_of(node(), ib="maybe")
    assert env_of(node(gpu_count=1, ib_ports=ACTIVE), ib="on")["NCCL_IB_DISABLE"] == "0"


def test_nccl_debug_keys():
    env = env_of(node(gpu_count=1), nccl_debug=True)
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert "NCCL_DEBUG" not in env_of(node(gpu_count=1))


def test_env_omits_socket_ifname_when_none_found():
    env = env_of(node(interfaces=("lo", "docker0"), route_interface="docker0"))
    assert "NCCL_SOCKET_IFNAME" not in env and "GLOO_SOCKET_IFNAME" not in env


def test_nccl_ib_hca_forms():
    two = (IBPort("mlx5_0", 1, "ACTIVE", "InfiniBand"), IBPort("mlx5_1", 1, "ACTIVE", "InfiniBand"))
    assert nccl_ib_hca(two, two) == "mlx5_0,mlx5_1"
    # a second port of the device is down: name the port
    ports = (IBPort("mlx5_0", 1, "ACTIVE", "InfiniBand"), IBPort("mlx5_0", 2, "DOWN", "InfiniBand"))
    assert nccl_ib_hca(ports[:1], ports) == "mlx5_0:1"
    # mlx5_1 is a prefix of mlx5_10 (down): exact match
    ports = (IBPort("mlx5_1", 1, "ACTIVE", "InfiniBand"), IBPort("mlx5_10", 1, "DOWN", "InfiniBand"))
    assert nccl_ib_hca(ports[:1], ports) == "=mlx5_1"


def test_transport_summary():
    assert transport_summary(node(ib_ports=ACTIVE), "nccl", "auto") == "NCCL over InfiniBand (mlx5_0:1)"
    assert transport_summary(node(ib_ports=ROCE), "nccl", "auto") == "NCCL over RoCE (mlx5_0:1)"
    assert transport_summary(node(), "nccl", "auto") == "NCCL over sockets (eth0)"
    assert transport_summary(node(ib_ports=ACTIVE), "nccl", "off") == "NCCL over sockets (eth0)"
    assert transport_summary(node(), "gloo", "auto", interface="lo") == "gloo over TCP (lo)"
    assert transport_summary(node(ib_ports=ACTIVE), "mpi", "auto") == "MPI over UCX on InfiniBand (mlx5_0:1)"
    assert transport_summary(node(), "nccl", "auto", single_node=True).startswith("NCCL within the node")


# ---------------------------------------------------------------------------------------------
# backend


def test_resolve_backend():
    assert resolve_backend("auto", 4, 4) == ("nccl", None)
    assert resolve_backend("auto", 8, 2) == ("nccl", None)
    assert resolve_backend("auto", 0, 2) == ("gloo", "no CUDA GPUs found: using gloo")
    backend, why = resolve_backend("auto", 1, 2)
    assert backend == "gloo" and why and "1 CUDA GPU for 2 processes" in why and "\n" not in why
    assert resolve_backend("nccl", 2, 2) == ("nccl", None)
    assert resolve_backend("gloo", 8, 8) == ("gloo", None)
    assert resolve_backend("mpi", 0, 2) == ("mpi", None)


def test_resolve_backend_nccl_without_gpus_is_one_sentence():
    with pytest.raises(UsageError) as err:
        resolve_backend("nccl", 0, 2)
    assert str(err.value) == "--backend nccl needs at least 2 CUDA GPUs per node, but this node has 0."
    with pytest.raises(
        UsageError, match=r"^--backend nccl needs at least 1 CUDA GPU per node, but node 1 \(b\) has 0\.$"
    ):
        resolve_backend("nccl", 0, 1, where="node 1 (b)")
    with pytest.raises(UsageError, match="--backend"):
        resolve_backend("ncl", 2, 2)


# ---------------------------------------------------------------------------------------------
# Azure VM sizes


@pytest.mark.parametrize(
    ("size", "rdma"),
    [
        ("Standard_NC24rs_v3", True),
        ("Standard_NC24s_v3", False),
        ("Standard_ND96asr_v4", True),
        ("Standard_ND96amsr_A100_v4", True),
        ("Standard_ND96isr_H100_v5", True),
        ("Standard_ND40rs_v2", True),
        ("Standard_HB120rs_v3", True),
        ("Standard_HB120-96rs_v3", True),
        ("Standard_HC44rs", True),
        ("Standard_H16r", True),
        ("Standard_NC24r", True),
        ("Standard_NC24ads_A100_v4", False),
        ("Standard_NC96ads_A100_v4", False),
        ("Standard_NC4as_T4_v3", False),
        ("Standard_D4s_v5", False),
        ("Standard_DS3_v2", False),  # capital S is part of the family, not a capability
        ("Standard_NC6", False),
        ("standard_nc24rs_v3", True),  # Azure reads size names case-insensitively
        ("Standard_NC40ADS_H100_V5", False),
        ("Standard_DS3_v2_Promo", False),
        ("Standard_", None),
        ("not a size", None),
        ("", None),
    ],
)
def test_is_rdma_vm_size(size, rdma):
    assert is_rdma_vm_size(size) is rdma


def test_parse_vm_size():
    p = parse_vm_size("Standard_ND96amsr_A100_v4")
    assert p is not None
    assert (p.family, p.vcpus, p.capabilities, p.accelerator, p.version) == ("ND", 96, "amsr", ("A100",), 4)
    p = parse_vm_size("Standard_HB120-96rs_v3")
    assert p is not None and (p.vcpus, p.constrained_vcpus, p.capabilities) == (120, 96, "rs")
    p = parse_vm_size("NC24")
    assert p is not None and (p.family, p.version, p.capabilities) == ("NC", 1, "")


@pytest.mark.parametrize(
    ("size", "no_sriov"),
    [
        ("Standard_NC24r", True),
        ("Standard_NC24rs_v2", True),
        ("Standard_ND24rs", True),
        ("Standard_H16r", True),
        ("Standard_H16mr", True),
        ("Standard_NC24rs_v3", False),
        ("Standard_ND40rs_v2", False),
        ("Standard_HB120rs_v3", False),
        ("Standard_ND96asr_v4", False),
        ("Standard_NC24s_v3", False),
    ],
)
def test_rdma_without_sriov(size, no_sriov):
    assert rdma_without_sriov(size) is no_sriov


@pytest.mark.parametrize(
    ("size", "gen"),
    [
        ("Standard_ND96isr_H100_v5", "ndv5"),
        ("Standard_ND96asr_v4", "ndv4"),
        ("Standard_NC24ads_A100_v4", "ncv4"),
        ("Standard_ND40rs_v2", "ndv2"),
        ("Standard_NC24rs_v3", None),
        ("not a size", None),
    ],
)
def test_topo_generation(size, gen):
    assert topo_generation(size) == gen


def test_node_view_reports_address_fabric_and_free_ports(monkeypatch):
    monkeypatch.setattr(node_probe, "detect_gpus", lambda: (0, ()))
    monkeypatch.setattr(node_probe, "detect_mpi", lambda: (None, None))
    view = node_probe.node_view("127.0.0.1", None, 2)
    assert view["addr"] == "127.0.0.1" and view["host"] == socket.gethostname()
    assert len(set(view["ports"])) == 3
    assert NodeFabric.from_json(view["fabric"]).route_interface == "lo"
    assert node_probe.detect_node_json("127.0.0.1")["route_interface"] == "lo"


# ---------------------------------------------------------------------------------------------
# topology file, GPUs, MPI


def _touch(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("<system/>")
    return str(path)


def test_topo_file_choice(tmp_path):
    v4 = _touch(tmp_path / "ndv4-topo.xml")
    v5 = _touch(tmp_path / "ndv5-topo.xml")
    missing = str(tmp_path / "ncv4-topo.xml")
    cands = (missing, v5, v4)
    assert detect_topo_file(cands, None, None) == (None, (v5, v4))  # ambiguous without a size
    assert detect_topo_file(cands, "Standard_ND96asr_v4", None)[0] == v4
    assert detect_topo_file(cands, "Standard_ND96isr_H100_v5", None)[0] == v5
    assert detect_topo_file((missing, v4), None, None)[0] == v4  # the only one
    conf = tmp_path / "nccl.conf"
    conf.write_text(f"NCCL_IB_PCI_RELAXED_ORDERING=1\nNCCL_TOPO_FILE={v5}\n")
    assert detect_topo_file(cands, "Standard_ND96asr_v4", str(conf))[0] == v5  # the image's choice wins


def test_filter_visible_devices():
    names = ["A", "B", "C"]
    assert node_probe._filter_visible(names, None) == names
    assert node_probe._filter_visible(names, "2,0") == ["C", "A"]
    assert node_probe._filter_visible(names, "") == []
    assert node_probe._filter_visible(names, "-1") == []
    assert node_probe._filter_visible(names, "1,7,2") == ["B"]
    assert node_probe._filter_visible(names, "GPU-1234") == names


def test_detect_gpus_counts_what_torch_can_use(monkeypatch):
    pytest.importorskip("torch")
    import torch

    monkeypatch.setattr(node_probe, "_nvml_names", lambda: None)
    monkeypatch.setattr(node_probe, "_nvidia_smi_names", lambda: ["NVIDIA H200", "NVIDIA H200"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)  # e.g. a CPU-only build
    assert node_probe.detect_gpus() == (0, ("NVIDIA H200", "NVIDIA H200"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert node_probe.detect_gpus() == (2, ("NVIDIA H200", "NVIDIA H200"))


def _fake_exe(path: Path, output: str) -> str:
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.skipif(sys.platform == "win32", reason="shell scripts")
def test_detect_mpi_parses_versions(tmp_path):
    ompi = tmp_path / "ompi" / "mpiexec"
    ompi.parent.mkdir()
    _fake_exe(ompi, "mpiexec (Open MPI) 4.1.5\n\nReport bugs to https://www.open-mpi.org/community/help/")
    _fake_exe(ompi.with_name("ompi_info"), 'mca:pml:ob1:version:"mca:2.1.0"\nmca:pml:ucx:version:"mca:2.1.0"')
    assert node_probe.detect_mpi(str(ompi)) == (f"Open MPI 4.1.5 (mpiexec at {ompi})", True)
    mpich = tmp_path / "mpich" / "mpiexec"
    mpich.parent.mkdir()
    _fake_exe(mpich, "HYDRA build details:\n    Version:                                 4.1.2\n")
    assert node_probe.detect_mpi(str(mpich)) == (f"MPICH 4.1.2 (mpiexec at {mpich})", None)


def test_find_mpiexec_prefers_this_environment(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = _fake_exe(bindir / "mpiexec", "x")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert node_probe.find_mpiexec() == exe
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "nowhere"))
    monkeypatch.setenv("PATH", str(bindir) + os.pathsep + os.environ.get("PATH", ""))
    assert node_probe.find_mpiexec() == exe
