"""Engines on two "hosts" for real: network namespaces on this machine, each with its own address,
host name and sshd; `--hosts` starts the engines there through ssh, under one Open MPI world.

The kernel (this test process) stays in the root namespace, as a notebook would; it reaches the
hosts through a bridge. Everything the fixture creates (sshd processes, namespaces, the bridge)
is removed by its finalizer, also when a test fails. Needs root (network namespaces) and sshd
(Debian's openssh-server; .ci/run installs it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from cells import ddp_cell

import jupyter_dist
from jupyter_dist.cluster.hosts import SSH_ENV

pytestmark = [pytest.mark.engines, pytest.mark.timeout(600)]

NET = f"10.213.{100 + os.getpid() % 100}"  # private addresses used only inside this test's namespaces
KERNEL_ADDR = f"{NET}.1"
HOST_ADDRS = (f"{NET}.2", f"{NET}.3")
TAG = f"jd{os.getpid() % 100000}"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


class TwoHosts:
    """Two namespaces `<tag>h0`, `<tag>h1` on a bridge; an sshd in each; keys in a temp dir."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.bridge = f"{TAG}br"
        self.names = [f"{TAG}h{i}" for i in range(len(HOST_ADDRS))]
        self.hostnames = [f"jdhost{i}" for i in range(len(HOST_ADDRS))]
        self.sshd: list[subprocess.Popen] = []
        self.ssh_config = tmp / "ssh_config"

    def create(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{KERNEL_ADDR}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, (ns, addr) in enumerate(zip(self.names, HOST_ADDRS, strict=True)):
            _ip("netns", "add", ns)
            _ip("link", "add", f"{TAG}v{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", f"{TAG}v{i}", "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def start_sshd(self) -> None:
        t = self.tmp
        for kind in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(t / kind)], check=True)
        shutil.copy(t / "client_key.pub", t / "authorized_keys")
        host_pub = " ".join((t / "host_key.pub").read_text().split()[:2])
        (t / "known_hosts").write_text("".join(f"{a} {host_pub}\n" for a in HOST_ADDRS))
        self.ssh_config.write_text(textwrap.dedent(f"""\
            Host {NET}.*
              User root
              IdentityFile {t / 'client_key'}
              IdentitiesOnly yes
              UserKnownHostsFile {t / 'known_hosts'}
              StrictHostKeyChecking yes
              BatchMode yes
              ConnectTimeout 10
            """))
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        for ns, addr, name in zip(self.names, HOST_ADDRS, self.hostnames, strict=True):
            conf = t / f"sshd_{name}.conf"
            conf.write_text(textwrap.dedent(f"""\
                ListenAddress {addr}
                HostKey {t / 'host_key'}
                AuthorizedKeysFile {t / 'authorized_keys'}
                PidFile none
                UsePAM no
                StrictModes no
                PasswordAuthentication no
                KbdInteractiveAuthentication no
                PermitRootLogin prohibit-password
                LogLevel ERROR
                """))
            # its own UTS namespace: a host name of its own, as Open MPI tells nodes apart by name
            cmd = f"hostname {name} && exec {sshd} -D -e -f {conf}"
            log = open(t / f"sshd_{name}.log", "w")  # noqa: SIM115 - closed with the process
            self.sshd.append(subprocess.Popen(["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c", cmd],
                                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        for addr in HOST_ADDRS:
            self._wait_ssh(addr)

    def _wait_ssh(self, addr: str) -> None:
        deadline = time.monotonic() + 30
        while True:
            res = subprocess.run(["ssh", "-F", str(self.ssh_config), addr, "hostname"], capture_output=True, text=True)
            if res.returncode == 0:
                return
            if time.monotonic() > deadline:
                logs = "\n".join(p.read_text() for p in self.tmp.glob("sshd_*.log"))
                raise RuntimeError(f"ssh to {addr} failed: {res.stderr}\nsshd logs:\n{logs}")
            time.sleep(0.3)

    def pids_inside(self) -> list[int]:
        pids: list[int] = []
        for ns in self.names:
            res = _ip("netns", "pids", ns, check=False)
            pids += [int(p) for p in res.stdout.split()]
        return pids

    def destroy(self) -> None:
        """Every sshd, every process left in the namespaces (all started by this test), the namespaces, the bridge."""
        for p in self.sshd:
            p.terminate()
        for p in self.sshd:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        procs = []
        for pid in self.pids_inside():
            with contextlib.suppress(psutil.Error):
                procs.append(psutil.Process(pid))
        for p in procs:
            p.kill()
        psutil.wait_procs(procs, timeout=10)
        for i, ns in enumerate(self.names):
            _ip("link", "del", f"{TAG}v{i}", check=False)  # both veth ends now (as tests/slurm_cluster.py)
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", self.bridge, check=False)


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory, request):
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root: this machine forbids them to this user")
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2) to create network namespaces")
    probe = f"{TAG}probe"
    res = _ip("netns", "add", probe, check=False)
    if res.returncode != 0:
        pytest.skip(f"this machine forbids network namespaces: `ip netns add` said {res.stderr.strip()!r}")
    _ip("netns", "del", probe, check=False)
    if shutil.which("sshd") is None and not Path("/usr/sbin/sshd").exists():
        pytest.fail("the multi-host test needs sshd: apt-get install openssh-server (.ci/run does)")
    hosts = TwoHosts(tmp_path_factory.mktemp("ssh"))
    request.addfinalizer(hosts.destroy)  # before anything exists, so a half set-up is removed too
    hosts.create()
    hosts.start_sshd()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SSH_ENV, f"ssh -F {hosts.ssh_config}")
        yield hosts


@pytest.fixture(scope="module")
def hosts_shell(two_hosts, shell):
    """The module's shell, set up after (so stopped before) the hosts."""
    return shell


HOSTS = ",".join(HOST_ADDRS)
WILDCARD = {"0.0.0.0", "::"}

WHERE = textwrap.dedent(
    """
    import os, socket, psutil
    addrs = sorted(a.address for nic in psutil.net_if_addrs().values() for a in nic
                   if a.family == socket.AF_INET and not a.address.startswith("127."))
    env = {k: os.environ.get(k) for k in ("RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "AZ_BATCHAI_MPI_MASTER_NODE",
                                          "AZ_BATCH_MASTER_NODE", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}
    """
)


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of each TCP socket `pid` listens on, read from its own network namespace's
    table (/proc/PID/net/tcp*): psutil matches against this namespace's table only."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = set()
    for kind, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/{pid}/net/{kind}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                continue
            hex_ip, hex_port = f[1].split(":")
            raw = bytes.fromhex(hex_ip)
            # the kernel prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            out.add((socket.inet_ntop(family, raw), int(hex_port, 16)))
    return out


def test_mpi_allreduce_across_hosts(hosts_shell, distrun, two_hosts):
    out = distrun(
        f"-f mpi --hosts {HOSTS} -n 2 -o got",
        WHERE + textwrap.dedent(
            """
            from mpi4py import MPI
            comm = MPI.COMM_WORLD
            total = comm.allreduce(comm.rank + 1)
            got = dict(rank=comm.rank, size=comm.size, total=total, host=socket.gethostname(), addrs=addrs, env=env)
            print("allreduce", total, "on", socket.gethostname())
            """
        ),
    )
    got = hosts_shell.user_ns["got"]
    assert [g["rank"] for g in got] == [0, 1, 2, 3] and {g["size"] for g in got} == {4}
    assert {g["total"] for g in got} == {10}
    for r, g in enumerate(got):
        node = r // 2
        assert g["addrs"] == [HOST_ADDRS[node]], (r, g)  # the rank runs inside its host's namespace
        assert g["host"] == two_hosts.hostnames[node]
        assert g["env"]["AZ_BATCHAI_MPI_MASTER_NODE"] == HOST_ADDRS[0] and g["env"]["NODE_RANK"] == str(node)
        assert g["env"]["AZ_BATCH_MASTER_NODE"].startswith(HOST_ADDRS[0] + ":")
        assert g["env"]["GLOO_SOCKET_IFNAME"] == "eth0"  # the interface that reaches node 0, found there
        assert f"[rank {r}|node {node}] allreduce 10 on {two_hosts.hostnames[node]}" in out.out
    cluster = jupyter_dist.get_session().cluster
    assert cluster.controller_ip == KERNEL_ADDR and cluster.node_addrs == HOST_ADDRS
    assert f"controller on {KERNEL_ADDR}; MPI over TCP on {NET}.0/24" in out.out
    # what mpiexec started the engines with: TCP between hosts, on the hosts' network only
    launch = next(iter(cluster._cluster.engines.values())).environment
    assert launch["OMPI_MCA_btl"] == "self,sm,tcp"
    assert launch["OMPI_MCA_btl_tcp_if_include"] == launch["PRTE_MCA_oob_tcp_if_include"] == f"{NET}.0/24"


def test_cluster_listens_only_on_the_hosts_network(hosts_shell, distrun, two_hosts):
    distrun(f"-f mpi --hosts {HOSTS} -n 2", "x = 1")
    cluster = jupyter_dist.get_session().cluster
    controller = cluster._cluster.controller.pid
    ctl = set()
    for p in [psutil.Process(controller), *psutil.Process(controller).children(recursive=True)]:
        ctl |= listening(p.pid)
    assert ctl and {ip for ip, _ in ctl} == {KERNEL_ADDR}, ctl
    inside = set(two_hosts.pids_inside())
    for e in cluster.engines:
        assert e.pid in inside  # the engine runs in a namespace, not on the kernel's host
        node = e.rank // 2
        found = listening(e.pid)
        # Open MPI's TCP transport: one listener per address family, bound to every address of the
        # host (Open MPI has no bind-address setting; btl_tcp_if_include keeps its traffic on the
        # hosts' network). Nothing else of the engine listens beyond the host.
        assert sorted(ip for ip, _ in found if ip in WILDCARD) == ["0.0.0.0", "::"], (e.rank, found)
        # everything else: the host's own address, or loopback between the engine and its nanny
        assert {ip for ip, _ in found} - WILDCARD <= {HOST_ADDRS[node], "127.0.0.1"}, (e.rank, found)
        for child in psutil.Process(e.pid).children(recursive=True):
            assert {ip for ip, _ in listening(child.pid)} <= {"127.0.0.1"}, (child.cmdline(), e.rank)
    # Not ours to limit: PRRTE's daemons (prted) keep their out-of-band listener on every address of
    # their host, like prterun on this one (docs/reliability.md).


DDP_CELL = ddp_cell(
    steps=5,
    result="params = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()\n"
    "got = dict(rank=dist.get_rank(), world=dist.get_world_size(), params=params, addrs=addrs, env=env)",
)


def test_pytorch_ddp_across_hosts(hosts_shell, distrun, two_hosts):
    flags = f"-f pytorch --backend gloo --hosts {HOSTS} -n 2 --timeout 300"
    distrun(flags, "x = 1")
    cluster = jupyter_dist.get_session().cluster
    before = {e.rank: listening(e.pid) for e in cluster.engines}
    out = distrun(flags + " -o got", WHERE + DDP_CELL)
    got = hosts_shell.user_ns["got"]
    assert [g["rank"] for g in got] == [0, 1, 2, 3] and {g["world"] for g in got} == {4}
    for r, g in enumerate(got):
        assert g["addrs"] == [HOST_ADDRS[r // 2]]
        assert g["env"]["MASTER_ADDR"] == HOST_ADDRS[0]
        assert g["env"]["GLOO_SOCKET_IFNAME"] == g["env"]["NCCL_SOCKET_IFNAME"] == "eth0"
        assert g["params"] == got[0]["params"]  # DDP kept every rank's replica identical
        assert f"[rank {r}|node {r // 2}] trained rank={r} world=4" in out.out
    # What torch added: gloo's sockets on the host's address (GLOO_SOCKET_IFNAME), and on rank 0
    # the TCPStore at MASTER_PORT, which torch binds to every address (docs/reliability.md).
    master_port = int(got[0]["env"]["MASTER_PORT"])
    for e in cluster.engines:
        new = listening(e.pid) - before[e.rank]
        store = {(ip, port) for ip, port in new if port == master_port}
        assert bool(store) == (e.rank == 0) and {ip for ip, _ in store} <= WILDCARD, (e.rank, new)
        assert {ip for ip, _ in new - store} == {HOST_ADDRS[e.rank // 2]}, (e.rank, new)


def test_ssh_launcher_engines_on_each_host(hosts_shell, distrun, two_hosts):
    """ipyparallel's SSH launcher: one ssh per engine, no MPI world; ranks placed by host."""
    out = distrun(
        f"-f pytorch --launcher ssh --hosts {HOSTS} -n 2 -o got --timeout 300",
        WHERE + textwrap.dedent(
            """
            import torch, torch.distributed as dist
            dist.init_process_group("gloo", init_method="env://")
            t = torch.tensor([float(dist.get_rank() + 1)])
            dist.all_reduce(t)
            import jupyter_dist as _jd
            got = dict(rank=dist.get_rank(), total=t.item(), host=socket.gethostname(), addrs=addrs, env=env, code=_jd.__file__)
            print("all_reduce", t.item())
            """
        ),
    )
    assert "started in parallel, one ssh per host, through ssh -F" in out.out
    got = hosts_shell.user_ns["got"]
    assert [g["rank"] for g in got] == [0, 1, 2, 3] and {g["total"] for g in got} == {10.0}
    for r, g in enumerate(got):
        assert g["addrs"] == [HOST_ADDRS[r // 2]] and g["host"] == two_hosts.hostnames[r // 2]
        assert g["env"]["MASTER_ADDR"] == HOST_ADDRS[0] and g["env"]["GLOO_SOCKET_IFNAME"] == "eth0"
        assert g["code"] == jupyter_dist.__file__  # the kernel's PYTHONPATH reached the engines
    cluster = jupyter_dist.get_session().cluster
    assert cluster.shape.launcher == "ssh" and cluster.controller_ip == KERNEL_ADDR
    inside = set(two_hosts.pids_inside())
    for e in cluster.engines:
        assert e.pid in inside
        # no MPI here: gloo on the host's address, loopback to the nanny, TCPStore on rank 0
        master_port = int(got[0]["env"]["MASTER_PORT"])
        found = listening(e.pid)
        assert {ip for ip, port in found if port != master_port} <= {HOST_ADDRS[e.rank // 2], "127.0.0.1"}, found
    _stop_and_check_hosts_empty(two_hosts)


def test_ssh_start_beside_mpi_start(hosts_shell, distrun, two_hosts, capsys):
    """The same layout (2 hosts x 2) started cold by each launcher: figures printed (docs/slurm.md), not asserted."""
    took = {}
    for launcher in ("mpi", "ssh"):
        jupyter_dist.get_session().cluster.stop()
        t0 = time.monotonic()
        distrun(f"-f pytorch --launcher {launcher} --hosts {HOSTS} -n 2 -o where", "import socket\nwhere = socket.gethostname()")
        took[launcher] = time.monotonic() - t0
        assert hosts_shell.user_ns["where"] == [two_hosts.hostnames[r // 2] for r in range(4)]
    with capsys.disabled():
        print(f"\ncold start to first result, 2 hosts x 2 engines: --launcher mpi {took['mpi']:.1f} s, "
              f"--launcher ssh {took['ssh']:.1f} s ({took['ssh'] / took['mpi']:.2f}x)")


def test_stop_leaves_nothing_on_the_hosts(hosts_shell, distrun, two_hosts):
    distrun(f"-f mpi --launcher mpi --hosts {HOSTS} -n 2", "x = 1")  # after ssh, whose launcher is remembered
    assert len(two_hosts.pids_inside()) > len(two_hosts.sshd)  # engines and Open MPI's daemons
    _stop_and_check_hosts_empty(two_hosts)


def _stop_and_check_hosts_empty(two_hosts: TwoHosts) -> None:
    jupyter_dist.get_session().cluster.stop()
    deadline = time.monotonic() + 30
    sshd = {p.pid for p in two_hosts.sshd}
    while set(two_hosts.pids_inside()) - sshd and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [(pid, _cmd(pid)) for pid in set(two_hosts.pids_inside()) - sshd]
    assert not left, left


def _cmd(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return "?"


def test_bad_hosts_fail_before_anything_starts(hosts_shell, distrun):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="-f mpi needs one MPI world"):
        distrun(f"-f mpi --launcher ssh --hosts {HOSTS} -n 2", "x = 1")
    with pytest.raises(UsageError, match="--launcher ssh starts engines on other hosts"):
        distrun("-f pytorch --launcher ssh --hosts localhost -n 2", "x = 1")
    with pytest.raises(UsageError, match="--launcher local"):
        distrun(f"--launcher local --hosts {HOSTS} -n 2", "x = 1")
    assert socket.gethostname()  # the kernel never left the root namespace
