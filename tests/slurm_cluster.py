"""A real Slurm cluster of several nodes on this machine, for the multi-node tests.

`slurmctld` and `munged` run in the root network namespace (where the kernel is, as on a login
node); each node is a `slurmd` in a network namespace of its own, with its own address on a veth
pair joined to a bridge, its own host name (a UTS namespace: Slurm and Open MPI tell nodes apart by
name) and its own spool, pid and log files (`%n` in slurm.conf). Process tracking and task
plugins need no cgroups (`proctrack/linuxproc`, `task/none`); munge is shared through its socket
file (a path-named Unix socket crosses network namespaces).

`SlurmCluster(1, namespaces=False)` is this host alone as the node, at 127.0.0.1, with no namespace
(tests/integration/test_slurm.py: Slurm on one workstation).

`SlurmCluster.destroy` removes everything it made (jobs, daemons, processes left in the
namespaces, the namespaces and the bridge) and is safe to call on a half-made cluster.
Needs root, iproute2, slurm-wlm and munge.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

from jupyter_dist.common.ports import free_ports

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


def missing_tools(namespaces: bool = True) -> list[str]:
    wanted = (*DAEMONS, "ip") if namespaces else DAEMONS
    return [d for d in wanted if shutil.which(d) is None and not Path("/usr/sbin", d).exists()]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _hardware() -> tuple[str, str]:
    """This host's Slurm name and its CPUs and memory as `slurmd -C` says (every node is this machine)."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True, timeout=60).stdout
    line = next(line for line in out.splitlines() if line.startswith("NodeName="))
    name = line.split()[0].removeprefix("NodeName=")
    return name, " ".join(w for w in line.split() if not w.startswith(("NodeName=", "UpTime=")))


def _stop_pidfile(pidfile: Path) -> None:
    """Stop the daemon whose pid file this is (ours only), waiting for it to go."""
    try:
        pid = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + wait
        while time.monotonic() < end:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


class SlurmCluster:
    """`nodes` slurmd nodes `<tag>n0..`, each in namespace `<tag>n<i>` at `<net>.<2+i>`; the host at `<net>.1`."""

    def __init__(self, nodes: int, private: dict[int, list[str]] | None = None, namespaces: bool = True,
                 resolve_names: bool = False) -> None:
        """`private`: node -> folders that node sees as an empty tmpfs of its own (a node-local disk
        where the kernel's host has a folder of the same path: no shared state folder).
        `namespaces=False`: one node, this host itself at 127.0.0.1 (a Slurm on one workstation).
        `resolve_names`: the node names resolve to the nodes' addresses on every node (an /etc/hosts of
        each namespace, which `ip netns exec` mounts from /etc/netns/<name>/), as on most clusters;
        otherwise a name resolves nowhere (only slurmctld knows the nodes' addresses)."""
        if not namespaces and (nodes != 1 or private):
            raise ValueError("a Slurm without namespaces has one node, this host, and nothing private")
        self.private = private or {}
        self.resolve_names = resolve_names and namespaces
        self.namespaces = namespaces
        self.tag = f"js{os.getpid() % 100000}"
        self.net = f"10.214.{100 + os.getpid() % 100}"
        self.host_addr = f"{self.net}.1"
        self.names = [f"{self.tag}n{i}" for i in range(nodes)]  # node names = namespace names = host names
        self.addrs = [f"{self.net}.{2 + i}" for i in range(nodes)]
        if not namespaces:
            self.host_addr, self.names, self.addrs = "127.0.0.1", [_hardware()[0]], ["127.0.0.1"]
        self.bridge = f"{self.tag}br"
        self.dir = Path(tempfile.mkdtemp(prefix="jd-slurmn-"))  # short: the munge socket path must fit in sun_path
        self.conf = self.dir / "slurm.conf"
        self.slurmd: list[subprocess.Popen] = []
        self._saved_conf = os.environ.get("SLURM_CONF")

    # -- set-up ---------------------------------------------------------------------

    def create(self, timeout: float = 90.0) -> None:
        if self.namespaces:
            self._network()
        self._config()
        os.environ["SLURM_CONF"] = str(self.conf)
        d = self.dir
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        # -f: run as root; every file it uses lives in d
        subprocess.run(["munged", "-f", f"--socket={d}/munge.sock", f"--key-file={key}", f"--log-file={d}/munged.log",
                        f"--pid-file={d}/munged.pid", f"--seed-file={d}/munged.seed"], check=True, timeout=60)
        subprocess.run(["slurmctld"], check=True, timeout=60)
        for i, name in enumerate(self.names):
            log = open(d / f"slurmd-{name}.out", "w")  # noqa: SIM115 - closed with the process
            # `ip netns exec` mounts a fresh /sys, without the cgroup file systems slurmd 22.05 checks for
            # even with proctrack/linuxproc and task/none (a bind of the host's is refused here): a tmpfs
            # and the named systemd hierarchy (the only one it stats), mounted again in this namespace
            cg = "/sys/fs/cgroup"
            own = "".join(f"mount -t tmpfs -o mode=0700 jd_private {shlex.quote(p)} && " for p in self.private.get(i, ()))
            for p in self.private.get(i, ()):
                Path(p).mkdir(parents=True, exist_ok=True)  # the mount point, on the host
            cmd = (f"mount -t tmpfs cgroup_root {cg} && mkdir {cg}/systemd && "
                   f"mount -t cgroup -o none,name=systemd cgroup {cg}/systemd && {own}hostname {name} && exec slurmd -D")
            argv = ["ip", "netns", "exec", name, "unshare", "--uts", "sh", "-c", cmd] if self.namespaces else ["slurmd", "-D"]
            self.slurmd.append(subprocess.Popen(argv,
                                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                env={**os.environ, "SLURM_CONF": str(self.conf)}))
        self.wait_idle(timeout)

    def _network(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.host_addr}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, (ns, addr) in enumerate(zip(self.names, self.addrs, strict=True)):
            _ip("netns", "add", ns)
            _ip("link", "add", f"{self.tag}v{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", f"{self.tag}v{i}", "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        if self.resolve_names:
            hosts = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in zip(self.names, self.addrs, strict=True))
            for ns in self.names:
                (Path("/etc/netns") / ns).mkdir(parents=True, exist_ok=True)
                (Path("/etc/netns") / ns / "hosts").write_text(hosts)

    def _config(self) -> None:
        d = self.dir
        (d / "state").mkdir()
        ctld_port, slurmd_port = free_ports(2)
        hw = _hardware()[1]
        nodes = "\n".join(f"NodeName={n} NodeAddr={a} {hw} State=UNKNOWN" for n, a in zip(self.names, self.addrs,
                                                                                             strict=True))
        for n in self.names:
            (d / f"spool-{n}").mkdir()
        self.conf.write_text(textwrap.dedent(
            f"""\
            ClusterName=jdmulti
            SlurmctldHost={socket.gethostname().split(".")[0]}({self.host_addr})
            SlurmctldPort={ctld_port}
            SlurmdPort={slurmd_port}
            SlurmUser=root
            SlurmdUser=root
            AuthType=auth/munge
            CredType=cred/munge
            AuthInfo=socket={d}/munge.sock
            StateSaveLocation={d}/state
            SlurmdSpoolDir={d}/spool-%n
            SlurmctldPidFile={d}/slurmctld.pid
            SlurmdPidFile={d}/slurmd-%n.pid
            SlurmctldLogFile={d}/slurmctld.log
            SlurmdLogFile={d}/slurmd-%n.log
            ProctrackType=proctrack/linuxproc
            TaskPlugin=task/none
            SwitchType=switch/none
            MpiDefault=none
            ReturnToService=2
            SchedulerType=sched/builtin
            SelectType=select/cons_tres
            SelectTypeParameters=CR_Core
            JobCompType=jobcomp/none
            AccountingStorageType=accounting_storage/none
            JobAcctGatherType=jobacct_gather/none
            SlurmctldDebug=info
            SlurmdDebug=info
            """) + nodes + f"\nPartitionName=debug Nodes={','.join(self.names)} Default=YES MaxTime=INFINITE State=UP\n")

    def states(self) -> dict[str, str]:
        out = subprocess.run(["sinfo", "-N", "-h", "-o", "%N %T"], capture_output=True, text=True, timeout=30).stdout
        return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)

    def wait_idle(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < end:
            states = self.states()
            if sorted(states) == sorted(self.names) and set(states.values()) == {"idle"}:
                return
            if any(p.poll() is not None for p in self.slurmd):
                break
            time.sleep(0.5)
        raise RuntimeError(f"the Slurm nodes did not become idle (states {states}):\n{self.logs()}")

    # -- what a test reads ----------------------------------------------------------

    def jobs(self) -> list[tuple[str, str, str]]:
        """(id, name, state) of every job."""
        out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True, timeout=30).stdout
        return [tuple(line.split()) for line in out.splitlines() if line.strip()]

    def pids_inside(self) -> list[int]:
        pids: list[int] = []
        for ns in self.names if self.namespaces else ():
            res = _ip("netns", "pids", ns, check=False)
            pids += [int(p) for p in res.stdout.split()]
        return pids

    def logs(self, lines: int = 20) -> str:
        parts = []
        for p in sorted(self.dir.glob("*.log")) + sorted(self.dir.glob("*.out")):
            text = p.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {p.name}\n" + "\n".join(text))
        return "\n".join(parts)

    # -- tear-down ------------------------------------------------------------------

    def destroy(self) -> None:
        """Jobs, daemons, every process left in the namespaces (all started here), namespaces, bridge."""
        with contextlib.suppress(Exception):
            subprocess.run(["scancel", "--user", str(os.getuid())], capture_output=True, timeout=30)
        for p in self.slurmd:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
        for p in self.slurmd:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        procs = []
        for pid in self.pids_inside():
            with contextlib.suppress(psutil.Error):
                procs.append(psutil.Process(pid))
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(procs, timeout=10)
        for name in ("slurmctld.pid", "munged.pid"):
            _stop_pidfile(self.dir / name)
        if self.namespaces:
            for i, ns in enumerate(self.names):
                # the veth first: deleting it removes both ends now, where a deleted namespace frees its end
                # later, and the next cluster of this process (same tag) failed to add the same name meanwhile
                _ip("link", "del", f"{self.tag}v{i}", check=False)
                _ip("netns", "del", ns, check=False)
                shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
            with contextlib.suppress(OSError):
                Path("/etc/netns").rmdir()  # when no other namespace has files there
            _ip("link", "del", self.bridge, check=False)
        if self._saved_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = self._saved_conf
        shutil.rmtree(self.dir, ignore_errors=True)


def module_cluster(request, nodes: int, private: dict[int, list[str]] | None = None,
                   resolve_names: bool = False) -> SlurmCluster:
    """A test module's Slurm of `nodes` nodes, idle, removed after the module (also when half made);
    skips the module where it cannot be built (not root, Slurm not installed)."""
    import pytest  # only the tests import this module

    if os.geteuid() != 0:
        pytest.skip("a test Slurm of several nodes needs root (network namespaces, slurmd)")
    if missing := missing_tools():
        pytest.skip(f"Slurm is not installed (no {', '.join(missing)}): apt-get install slurm-wlm munge iproute2")
    cluster = SlurmCluster(nodes, private=private, resolve_names=resolve_names)
    request.addfinalizer(cluster.destroy)  # before anything exists, so a half set-up is removed too
    t0 = time.monotonic()
    cluster.create()
    print(f"\nSlurm of {len(cluster.names)} nodes idle after {time.monotonic() - t0:.1f} s")
    return cluster


# A cell's prefix that says where its rank runs: `where` (host name, its non-loopback addresses, the
# rank's layout variables, the jupyter_dist it imported)
WHERE = textwrap.dedent(
    """
    import os, socket, psutil, jupyter_dist as _jd
    addrs = sorted(a.address for nic in psutil.net_if_addrs().values() for a in nic
                   if a.family == socket.AF_INET and not a.address.startswith("127."))
    env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                          "AZ_BATCH_MASTER_NODE", "AZ_BATCHAI_MPI_MASTER_NODE", "GLOO_SOCKET_IFNAME",
                                          "NCCL_SOCKET_IFNAME", "TF_CONFIG", "HOROVOD_GLOO_RENDEZVOUS_ADDR",
                                          "HOROVOD_HOSTNAME", "HOROVOD_GLOO_IFACE")}
    where = dict(host=socket.gethostname(), addrs=addrs, env=env, code=_jd.__file__)
    """
)
