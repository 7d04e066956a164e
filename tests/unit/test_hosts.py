"""The pure parts of engines on other hosts: host files, mpiexec's arguments, addresses, checks."""

from __future__ import annotations

import json
import socket

import pytest
from IPython.core.error import UsageError

from jupyter_dist.cluster import hosts
from jupyter_dist.cluster.engines import check_shape
from jupyter_dist.cluster.shape import ClusterShape
from jupyter_dist.common.hosts import is_local_host
from jupyter_dist.frameworks import RunContext, get
from jupyter_dist.plan.defaults import RunDefaults
from jupyter_dist.plan.layout import build_layout, master_address
from jupyter_dist.plan.spec import parse_args as parse
from jupyter_dist.plan.spec import read_hostfile, resolve


def test_hostfile_text_one_line_per_host_with_its_slots():
    assert hosts.hostfile_text(("node1", "node2"), 4) == "node1 slots=4\nnode2 slots=4\n"
    # a host named twice holds both nodes' ranks, still in node order
    assert hosts.hostfile_text(("a", "b", "a"), 2) == "a slots=4\nb slots=2\n"
    assert hosts.hostfile_text(("fe80::1", "10.0.0.2"), 1) == "fe80::1 slots=1\n10.0.0.2 slots=1\n"


def test_mpiexec_host_args():
    args = hosts.mpiexec_host_args("/p/hostfile", prefix="/venv")
    assert args[:6] == ["--hostfile", "/p/hostfile", "--map-by", "slot", "--prefix", "/venv"]
    assert "plm_ssh_agent" not in args  # Open MPI's own default: ssh, with ~/.ssh/config
    assert args[6:] == ["-x", "IPP_CONNECTION_INFO", "-x", "PYTHONUNBUFFERED"]
    with_ssh = hosts.mpiexec_host_args("/h", prefix="/v", ssh="ssh -F /c", forward=("A",))
    assert with_ssh == ["--hostfile", "/h", "--map-by", "slot", "--prefix", "/v",
                        "--mca", "plm_ssh_agent", "ssh -F /c", "-x", "A"]


def test_ssh_command_from_the_environment():
    assert hosts.ssh_command({}) is None
    assert hosts.ssh_command({"JUPYTER_DIST_SSH": "  "}) is None
    assert hosts.ssh_command({"JUPYTER_DIST_SSH": "ssh  -F /etc/cluster.conf -p 2222"}) == "ssh -F /etc/cluster.conf -p 2222"
    for bad in ("ssh -o 'ProxyCommand=a b'", "ssh -i 'unclosed", "ssh -o Host=a:b"):
        with pytest.raises(UsageError, match=r"\$JUPYTER_DIST_SSH"):
            hosts.ssh_command({"JUPYTER_DIST_SSH": bad})


def test_controller_address_is_the_one_the_hosts_are_reached_from():
    assert hosts.pick_controller_address({"a": "10.1.0.1", "b": "10.1.0.1"}) == "10.1.0.1"
    with pytest.raises(UsageError, match="different addresses.*JUPYTER_DIST_CONTROLLER_IP"):
        hosts.pick_controller_address({"a": "10.1.0.1", "b": "192.168.5.1"})
    with pytest.raises(UsageError, match="loopback"):
        hosts.pick_controller_address({"me": "127.0.1.1", "b": "127.0.1.1"})
    with pytest.raises(UsageError, match="no host other than this one"):
        hosts.pick_controller_address({})
    # the user's choice wins, and must be an address
    assert hosts.pick_controller_address({"a": "10.1.0.1", "b": "192.168.5.1"}, "10.1.0.1") == "10.1.0.1"
    with pytest.raises(UsageError, match="must be an IP address"):
        hosts.pick_controller_address({"a": "10.1.0.1"}, "myhost")


def test_controller_address_via_the_routing_table():
    # 127.0.0.2 is routed through lo: a host there is this host under another name
    with pytest.raises(UsageError, match="loopback"):
        hosts.controller_address(["127.0.0.2"], {})
    assert hosts.controller_address(["127.0.0.2"], {"JUPYTER_DIST_CONTROLLER_IP": "10.9.9.9"}) == "10.9.9.9"
    assert hosts.source_address("127.0.0.2") == "127.0.0.1"


def test_resolve_host():
    assert hosts.resolve_host("10.0.0.7") == "10.0.0.7"
    assert hosts.resolve_host("localhost").startswith("127.")
    with pytest.raises(UsageError, match="does not resolve"):
        hosts.resolve_host("no-such-host.invalid")


def test_include_networks():
    assert hosts.include_networks("10.213.5.1", 24, ["10.213.5.2", "10.213.5.3"]) == "10.213.5.0/24"
    # a host outside the kernel's network is included by its own address
    assert hosts.include_networks("10.1.0.1", 16, ["10.1.3.4", "172.16.0.9", "172.16.0.9"]) == "10.1.0.0/16,172.16.0.9/32"
    assert hosts.include_networks("fd00::1", 64, ["fd00::2", "fd01::2"]) == "fd00::/64,fd01::2/128"


def test_multihost_mpi_env_leaves_the_users_settings():
    env = hosts.multihost_mpi_env("10.0.0.0/24", {})
    assert env == {"OMPI_MCA_btl": "self,sm,tcp", "OMPI_MCA_btl_tcp_if_include": "10.0.0.0/24",
                   "PRTE_MCA_oob_tcp_if_include": "10.0.0.0/24"}
    mine = hosts.multihost_mpi_env("10.0.0.0/24", {"OMPI_MCA_btl_tcp_if_include": "ib0"})
    assert "OMPI_MCA_btl_tcp_if_include" not in mine and mine["PRTE_MCA_oob_tcp_if_include"] == "10.0.0.0/24"


def test_node_plan_from_each_nodes_view():
    views = [{"addr": "10.0.0.2", "ports": [5000, 5001, 5002]}, {"addr": "10.0.0.3", "ports": [6000, 6001, 6002]}]
    assert hosts.node_plan(views) == (("10.0.0.2", "10.0.0.3"), (5001, 5002, 6001, 6002), 5000)


def test_has_remote():
    assert not hosts.has_remote(())
    assert not hosts.has_remote(("localhost", "127.0.0.1"))
    assert hosts.has_remote(("localhost", "node2"))


def test_hostfile_parsing(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("# the cluster\nnode1 slots=4\n\n  node2   # second\n10.0.0.9 slots=2 max_slots=4\nfe80::2\n")
    assert read_hostfile(str(hf)) == ("node1", "node2", "10.0.0.9", "fe80::2")
    spec = resolve(parse(f"--hostfile {hf} -n 3"), RunDefaults(), mpiexec_found=True)
    assert spec.nodes == 4 and spec.procs_per_node == 3 and spec.world_size == 12
    hf.write_text("node1\nnode;rm\n")
    with pytest.raises(UsageError, match="--hostfile"):
        read_hostfile(str(hf))
    hf.write_text("# nothing\n")
    with pytest.raises(UsageError, match="names no hosts"):
        read_hostfile(str(hf))


def test_master_is_node_0_address_never_loopback_with_other_hosts():
    lay = build_layout(2, 2, ("10.213.0.2", "10.213.0.3"), master_port=29500)
    assert lay.master_addr == "10.213.0.2" and not lay.all_local
    assert lay.host_of(3) == "10.213.0.3"
    # node 0 on this host, among others: not 127.0.0.1, which the other host would take for itself
    mixed = build_layout(2, 1, ("localhost", "10.213.0.3"), master_port=1)
    assert mixed.master_addr != "127.0.0.1" and mixed.master_addr == master_address(mixed.hosts, False)
    assert build_layout(2, 1, (), master_port=1).master_addr == "127.0.0.1"


def test_tf_config_uses_the_host_addresses():
    spec = resolve(parse("-f tensorflow --hosts 10.213.0.2,10.213.0.3 -n 1"), RunDefaults(), mpiexec_found=True)
    lay = build_layout(2, 1, ("10.213.0.2", "10.213.0.3"), master_port=1, task_ports=(7001, 7002))
    cfg = json.loads(get("tensorflow").rank_env(RunContext(spec, lay, "gloo"), 1)["TF_CONFIG"])
    assert cfg["cluster"]["worker"] == ["10.213.0.2:7001", "10.213.0.3:7002"]
    assert cfg["task"] == {"type": "worker", "index": 1}


def test_check_shape():
    check_shape(ClusterShape("mpi", 4, ("a", "b")))
    check_shape(ClusterShape("local", 4, ()))
    check_shape(ClusterShape("ssh", 4, ("a", "b")), "torch")
    with pytest.raises(UsageError, match="-f mpi needs one MPI world"):
        check_shape(ClusterShape("ssh", 4, ("a", "b")), "mpi")
    with pytest.raises(UsageError, match="name them with --hosts"):
        check_shape(ClusterShape("ssh", 4, ()))
    with pytest.raises(UsageError, match="distinct host names"):
        check_shape(ClusterShape("ssh", 4, ("a", "a")))
    with pytest.raises(UsageError, match="--launcher local starts engines on this host only"):
        check_shape(ClusterShape("local", 4, ("a", "b")))


def test_this_hosts_name_needs_no_resolver(monkeypatch):
    """An engine reports `gethostname()`: checked every cell for every rank, it never waits for a resolver."""
    def no_resolver() -> str:
        raise AssertionError("getfqdn called")

    monkeypatch.setattr(socket, "getfqdn", no_resolver)
    assert is_local_host(socket.gethostname())
    monkeypatch.setattr(socket, "getfqdn", lambda: "node-a.example")
    assert is_local_host("node-a.example") and not is_local_host("node-b")
