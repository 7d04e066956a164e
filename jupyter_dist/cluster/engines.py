"""`EngineCluster`: the ipyparallel controller and engines behind `%%distrun`.

Started by the first run that needs it, reused while the shape (launcher, world size,
hosts) stays the same, restarted when it changes or an engine has died. Engines are mapped
to ranks by the MPI rank each one reports, never by engine id.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from IPython.core.error import UsageError

from jupyter_dist.cluster import hosts as hostmod
from jupyter_dist.cluster.launch_session import in_this_session
from jupyter_dist.common.hosts import is_local_host
from jupyter_dist.common.ports import free_ports
from jupyter_dist.engine import setup as engine_side
from jupyter_dist.plan.fabric_env import find_mpiexec

STATE_DIR = Path(os.environ.get("JUPYTER_DIST_DIR", Path.home() / ".jupyter_dist"))
START_TIMEOUT = float(os.environ.get("JUPYTER_DIST_START_TIMEOUT", "180"))


def open_mpi_env(world_size: int, cores: int, all_local: bool = True) -> tuple[dict[str, str], list[str]]:
    """Variables Open MPI needs for the engines we launch, and the sentences that explain them."""
    env: dict[str, str] = {}
    notes: list[str] = []
    if all_local:
        # one host: shared memory only, so no rank opens a TCP listener on every interface
        env["OMPI_MCA_btl"] = "self,sm"
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        notes.append("running as root: set OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 for mpiexec")
    if world_size > cores:
        env["PRTE_MCA_rmaps_default_mapping_policy"] = ":oversubscribe"
        notes.append(f"{world_size} ranks on {cores} cores: set PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe")
    return env, notes


def check_shape(shape: ClusterShape, family: str = "") -> None:
    """What this version cannot start, as one sentence naming the flag (before anything starts)."""
    if shape.launcher == "ssh":
        if not hostmod.has_remote(shape.hosts):
            raise UsageError("--launcher ssh starts engines on other hosts: name them with --hosts or --hostfile.")
        if len(set(shape.hosts)) != len(shape.hosts) or any(":" in h for h in shape.hosts):
            raise UsageError("--launcher ssh needs distinct host names or IPv4 addresses in --hosts, one per node.")
        if family == "mpi":
            raise UsageError("-f mpi needs one MPI world, which --launcher ssh does not make: use --launcher mpi.")
    if shape.launcher == "local" and hostmod.has_remote(shape.hosts):
        raise UsageError("--launcher local starts engines on this host only: use --launcher mpi with --hosts.")
    if shape.launcher not in ("mpi", "local", "slurm", "ssh"):
        raise UsageError(f"--launcher {shape.launcher} is not supported yet.")
    if shape.launcher == "slurm":
        slurm_job(shape)  # a bad option fails here, not at sbatch


def slurm_job(shape: ClusterShape) -> Any:
    """The Slurm job of a `--launcher slurm` shape; its options are checked on the way."""
    from jupyter_dist.cluster.launchers.slurm import job_from

    nodes = shape.slurm_nodes or 1
    return job_from(nodes, shape.world_size // nodes, shape.slurm)


@dataclass(frozen=True)
class ClusterShape:
    launcher: str
    world_size: int
    hosts: tuple[str, ...]
    # --launcher slurm only: the job's node count and sbatch options (a change means a new job)
    slurm_nodes: int = 0
    slurm: tuple[tuple[str, str], ...] = ()

    @property
    def procs_per_host(self) -> int:
        """Engines on each of `hosts` (one node per host)."""
        return self.world_size // len(self.hosts)


@dataclass
class EngineInfo:
    rank: int
    engine_id: int
    pid: int
    host: str


@dataclass
class EngineCluster:
    """One kernel's engines. Not thread-safe: driven from the notebook's main thread."""

    on_status: Callable[[], None] | None = None
    shape: ClusterShape | None = None
    engines: list[EngineInfo] = field(default_factory=list)  # index = rank
    master_port: int = 0
    task_ports: tuple[int, ...] = ()
    notes: list[str] = field(default_factory=list)
    applied: Any = None  # what the engines were last set up with (see Runner)
    generation: int = 0  # bumped whenever the engines start or stop: plans made for older ones are stale
    busy: bool = False
    state: str = "stopped"
    _cluster: Any = None
    _client: Any = None
    _watchdog: subprocess.Popen | None = None
    inherited_env: frozenset[str] = frozenset()
    _controller_ports: tuple[int, ...] | None = None
    # engines on other hosts: each node's address (node 0's is MASTER_ADDR) and fabric, as seen there
    node_addrs: tuple[str, ...] = ()
    node_fabrics: tuple[Any, ...] = ()
    controller_ip: str = "127.0.0.1"

    # -- lifecycle -------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._client is not None

    @property
    def client(self) -> Any:
        if self._client is None:
            raise RuntimeError("the cluster is not running")
        return self._client

    def alive(self) -> bool:
        """All engines still registered and their processes (where local) still there."""
        if self._client is None or self.shape is None:
            return False
        try:
            ids = set(self._client.ids)
        except Exception:  # noqa: BLE001 - a broken client means a dead cluster
            return False
        if any(e.engine_id not in ids for e in self.engines):
            return False
        return all(pid_alive(e.pid) for e in self.engines if is_local_host(e.host))

    def ensure(
        self,
        shape: ClusterShape,
        progress: Callable[[int, int, float], None] | None = None,
        say: Callable[[str], None] | None = None,
    ) -> bool:
        """Start or reuse engines of `shape`; True when it (re)started them. `say` hears why."""
        if self.shape == shape and self.alive():
            return False
        if self._client is not None:
            reason = (
                "an engine died: restarting the cluster (variables on the ranks are lost)"
                if self.shape == shape
                else f"the layout changed ({self._describe(self.shape)} -> {self._describe(shape)}): restarting the cluster"
            )
            if say is not None:
                say(reason)
            self.stop()
        self.start(shape, progress)
        return True

    @staticmethod
    def _describe(shape: ClusterShape | None) -> str:
        if shape is None:
            return "none"
        return f"{shape.world_size} ranks via {shape.launcher}"

    def start(self, shape: ClusterShape, progress: Callable[[int, int, float], None] | None = None) -> None:
        import ipyparallel as ipp

        check_shape(shape)
        remote = shape.launcher in ("mpi", "ssh") and hostmod.has_remote(shape.hosts)
        controller_ip = hostmod.controller_address(shape.hosts, os.environ) if remote else "127.0.0.1"
        self.controller_ip = controller_ip
        self.state = "starting"
        self._notify()
        cluster_id = f"jd-{os.getpid()}-{secrets.token_hex(3)}"
        profile_dir = STATE_DIR / "profiles" / cluster_id
        profile_dir.mkdir(parents=True, exist_ok=True)
        for d in (STATE_DIR, STATE_DIR / "profiles", profile_dir):
            os.chmod(d, 0o700)
        engines = {"mpi": "mpi", "ssh": "ssh"}.get(shape.launcher, "local")
        cluster = ipp.Cluster(
            profile_dir=str(profile_dir),
            cluster_id=cluster_id,
            engines=engines,
            n=shape.world_size,
            controller_ip=controller_ip,
            # one broadcast scheduler: its tree's inner links would listen on loopback
            controller_args=["--IPController.broadcast_scheduler_depth=0"] if remote else [],
            log_level=40,
            shutdown_atexit=True,
        )
        # a remote host's slots are its ranks (the host file says so): no oversubscription there
        cores = shape.world_size if remote else os.cpu_count() or 1
        env, notes = open_mpi_env(shape.world_size, cores, all_local=not remote)
        env["PYTHONUNBUFFERED"] = "1"
        if shape.launcher == "mpi":
            mpiexec = find_mpiexec()
            if mpiexec is None:
                raise RuntimeError("mpiexec not found")
            cluster.config.MPIEngineSetLauncher.mpi_cmd = [mpiexec]
            args = ["--bind-to", "none"]
            if remote:
                args += self._remote_mpi_args(shape, profile_dir, mpiexec, controller_ip, env, notes)
                # on a host without this profile directory (no shared home), the engine creates it
                cluster.config.MPIEngineSetLauncher.engine_args = ["--IPEngine.auto_create=True"]
            cluster.config.MPIEngineSetLauncher.mpi_args = args
            cluster.config.MPIEngineSetLauncher.environment = env
        elif shape.launcher == "ssh":
            notes = [self._configure_ssh(cluster, shape, controller_ip)]
        elif shape.launcher == "slurm":
            from jupyter_dist.cluster.launchers.slurm import configure

            mpiexec = find_mpiexec()
            if mpiexec is None:
                raise RuntimeError("mpiexec not found")
            notes += configure(cluster, slurm_job(shape), mpiexec, env)
        else:
            notes = []
            cluster.config.LocalEngineSetLauncher.environment = {"PYTHONUNBUFFERED": "1"}
        self.notes = notes
        self._cluster = cluster
        t0 = time.monotonic()
        try:
            with in_this_session():  # the ranks share the kernel's CPU share (launch_session.py)
                cluster.start_controller_sync()
                cluster.start_engines_sync(shape.world_size)
            self._start_watchdog()
            client = cluster.connect_client_sync()
            self._wait_for_engines(client, shape.world_size, t0, progress)
            self._client = client
            self._map_ranks(shape)
            if remote:
                self._probe_nodes(shape, controller_ip)
            self._write_pidfile()
            lock_down(profile_dir)
        except BaseException:
            self.stop()
            raise
        self.shape = shape
        if not remote:  # else node 0's engine chose them where they are used (_probe_nodes)
            ports = free_ports(1 + shape.world_size)
            self.master_port, self.task_ports = ports[0], ports[1:]
        self._engines_changed()
        self.state = "idle"
        self._notify()

    @staticmethod
    def _remote_mpi_args(
        shape: ClusterShape, profile_dir: Path, mpiexec: str, controller_ip: str, env: dict[str, str], notes: list[str]
    ) -> list[str]:
        """mpiexec's host file, remote prefix and ssh agent; TCP limited to the network joining the hosts."""
        ppn = shape.procs_per_host
        hostfile = profile_dir / "hostfile"
        hostfile.write_text(hostmod.hostfile_text(shape.hosts, ppn))
        addrs = [hostmod.resolve_host(h) for h in shape.hosts if not is_local_host(h)]
        include = hostmod.include_networks(controller_ip, hostmod.interface_prefixlen(controller_ip), addrs)
        env.update(hostmod.multihost_mpi_env(include, os.environ))
        ssh = hostmod.ssh_command(os.environ)
        notes.append(
            f"engines on {len(shape.hosts)} hosts ({', '.join(shape.hosts)}) started through {ssh or 'ssh'}; "
            f"controller on {controller_ip}; MPI over TCP on {env.get('OMPI_MCA_btl_tcp_if_include', include)}"
        )
        prefix = str(Path(mpiexec).resolve().parent.parent)
        return hostmod.mpiexec_host_args(str(hostfile), prefix=prefix, ssh=ssh)

    @staticmethod
    def _configure_ssh(cluster: Any, shape: ClusterShape, controller_ip: str) -> str:
        """ipyparallel's SSH engine launcher: `-n` engines per host, each started by its own ssh;
        the connection information travels in the environment (nothing copied with scp)."""
        ppn = shape.procs_per_host
        ssh = shlex.split(hostmod.ssh_command(os.environ) or "ssh")
        conf = cluster.config.SSHEngineSetLauncher
        conf.engines = {h: ppn for h in shape.hosts}
        conf.ssh_cmd = ssh
        conf.scp_cmd = ["scp", *ssh[1:]]  # scp reads the same -F/-i/-o options; used for engine logs
        conf.remote_python = sys.executable
        conf.environment = {"PYTHONUNBUFFERED": "1"}
        conf.engine_args = ["--IPEngine.auto_create=True"]
        cluster.config.SSHEngineLauncher.to_send = []
        return (f"engines on {len(shape.hosts)} hosts ({', '.join(shape.hosts)}) started one by one through "
                f"{' '.join(ssh)}; controller on {controller_ip}")

    def _ssh_ranks(self, shape: ClusterShape, ids: list[int], infos: list[dict[str, Any]]) -> dict[int, int]:
        """engine id -> rank for --launcher ssh: node by the host the engine is on, local rank by id."""
        ppn = shape.procs_per_host
        where = self._client[ids].apply_sync(hostmod.source_address, self.controller_ip)
        wanted = [(h, hostmod.resolve_host(h)) for h in shape.hosts]
        by_node: dict[int, list[int]] = {}
        for eid, addr, info in zip(ids, where, infos, strict=True):
            node = next((n for n, (h, a) in enumerate(wanted) if addr == a or info["host"] in (h, h.split(".")[0])), None)
            if node is None:
                raise RuntimeError(f"engine {eid} on {info['host']} ({addr}) is on none of --hosts {','.join(shape.hosts)}")
            by_node.setdefault(node, []).append(eid)
        ranks: dict[int, int] = {}
        for node, eids in by_node.items():
            if len(eids) != ppn:
                raise RuntimeError(f"{len(eids)} engines on {shape.hosts[node]}, not {ppn}")
            for local, eid in enumerate(sorted(eids)):
                ranks[eid] = node * ppn + local
        return ranks

    def _probe_nodes(self, shape: ClusterShape, controller_ip: str) -> None:
        """Each node's address (node 0's toward the controller, the others' toward node 0), its
        fabric as detected on it, and ports free there: asked of each node's first engine."""
        from jupyter_dist.plan.fabric_env import NodeFabric

        ppn = shape.procs_per_host
        leaders = [self.engines[n * ppn].engine_id for n in range(len(shape.hosts))]
        first = self._client[leaders[0]].apply_sync(hostmod.node_view, controller_ip, None, ppn)
        master = first["addr"]
        rest = self._client[leaders[1:]].apply_async(hostmod.node_view, master, master, ppn) if leaders[1:] else None
        views = [first, *(rest.get(timeout=60) if rest is not None else [])]
        self.node_addrs, self.task_ports, self.master_port = hostmod.node_plan(views)
        self.node_fabrics = tuple(NodeFabric.from_json(v["fabric"]) for v in views)

    def _wait_for_engines(
        self, client: Any, n: int, t0: float, progress: Callable[[int, int, float], None] | None
    ) -> None:
        last = -1
        while True:
            up = len(client.ids)
            elapsed = time.monotonic() - t0
            if progress and up != last:
                progress(up, n, elapsed)
                last = up
            if up >= n:
                if progress:
                    progress(up, n, elapsed)
                return
            if elapsed > START_TIMEOUT:
                raise TimeoutError(
                    f"only {up} of {n} engines registered after {elapsed:.0f} s; engine log:\n{self.engine_log()[-3000:]}"
                )
            self._check_engines_running()
            time.sleep(0.1)
            if progress and int(elapsed * 2) != int((elapsed - 0.1) * 2):
                progress(up, n, elapsed)

    def _check_engines_running(self) -> None:
        es = self._engine_set()
        if es is not None and es.state == "after":
            raise RuntimeError(f"the engines exited while starting; engine log:\n{self.engine_log()[-3000:]}")

    def _engine_set(self) -> Any:
        if self._cluster is None or not self._cluster.engines:
            return None
        return next(iter(self._cluster.engines.values()))

    def engine_log(self) -> str:
        es = self._engine_set()
        if es is None:
            return ""
        try:
            return es.get_output() or ""
        except Exception:  # noqa: BLE001 - the log is only informative
            return ""

    def rotate_master_port(self) -> None:
        self.master_port = free_ports(1)[0]

    def controller_ports(self) -> tuple[int, ...]:
        """Ports the controller listens on (engines' connections to them must never be cut)."""
        if self._controller_ports is None:
            ports: set[int] = set()
            for p in _process_tree(self._cluster_pids()[:1]):
                with contextlib.suppress(psutil.Error):
                    ports.update(c.laddr.port for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN)
            self._controller_ports = tuple(sorted(ports))
        return self._controller_ports

    def launcher_running(self) -> bool:
        """Whether the engines' launcher (mpiexec) is still there; it reports deaths as it ends."""
        es = self._engine_set()
        pid = getattr(es, "pid", None)
        if not pid or pid < 0:  # none, or an ssh engine set (no local process)
            return False
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def death_notes(self) -> dict[int, str]:
        """What `mpiexec` said about ranks that died: rank -> 'exited with code 3' / 'killed by signal 9 (Killed)'."""
        return parse_death_notes(self.engine_log())

    def _map_ranks(self, shape: ClusterShape) -> None:
        client = self._client
        ids = sorted(client.ids)
        infos = client[ids].apply_sync(engine_side.identify)
        ssh_ranks = self._ssh_ranks(shape, ids, infos) if shape.launcher == "ssh" else {}
        by_rank: dict[int, EngineInfo] = {}
        for eid, info in zip(ids, infos, strict=True):
            if shape.launcher == "ssh":
                rank = ssh_ranks[eid]
            elif shape.launcher in ("mpi", "slurm"):
                rank = info["mpi_rank"]
                if rank is None or info["mpi_size"] != shape.world_size:
                    raise RuntimeError(f"engine {eid} reports no MPI world of {shape.world_size}")
            else:
                rank = ids.index(eid)
            by_rank[rank] = EngineInfo(rank, eid, info["pid"], info["host"])
        self.engines = [by_rank[r] for r in range(shape.world_size)]
        self.inherited_env = frozenset(infos[0]["env_keys"])
        for e in self.engines:
            client[e.engine_id].apply_sync(engine_side.assign_rank, e.rank, self.stack_dir)

    def _start_watchdog(self) -> None:
        """A separate process that stops the cluster if this kernel dies without cleaning up."""
        self._write_pidfile()
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "jupyter_dist.cluster.watchdog", str(os.getpid()), str(self._pidfile)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def stack_dir(self) -> str:
        return str(Path(self._cluster.profile_dir) / "stacks")

    @property
    def _pidfile(self) -> Path:
        return Path(self._cluster.profile_dir) / "jupyter-dist.pids"

    def _write_pidfile(self) -> None:
        """What the watchdog stops if the kernel dies: local pids, and the engines' Slurm job."""
        pids = self._cluster_pids() + [e.pid for e in self.engines if is_local_host(e.host)]
        tokens = [str(p) for p in sorted(set(pids))]
        job_id = getattr(self._engine_set(), "job_id", None)
        if job_id:
            tokens.append(f"slurm:{job_id}")
        self._pidfile.write_text(" ".join(tokens))

    def _cluster_pids(self) -> list[int]:
        pids = []
        if self._cluster is None:
            return pids
        ctl = self._cluster.controller
        if ctl is not None and getattr(ctl, "pid", None):
            pids.append(ctl.pid)
        for es in self._cluster.engines.values():
            if (getattr(es, "pid", None) or 0) > 0:  # ssh engine sets have no local process (-1)
                pids.append(es.pid)
        return pids

    def stop(self) -> None:
        """Stop controller and engines; kill any process of theirs that outlives the stop."""
        roots = self._cluster_pids()
        groups = _own_groups(roots)
        tree = _process_tree(roots + [e.pid for e in self.engines if is_local_host(e.host)])
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
        if self._cluster is not None:
            with contextlib.suppress(Exception):
                self._cluster.stop_cluster_sync()
            with contextlib.suppress(Exception):
                self._cluster.remove_connection_file() if hasattr(self._cluster, "remove_connection_file") else None
        # a controller stopped right after it started may have forked its schedulers since `tree`
        # was taken: the controller and mpiexec run in process groups of their own, so take those too
        _kill_all(tree + _group_members(groups))
        if self._watchdog is not None:
            with contextlib.suppress(Exception):
                self._watchdog.kill()
                self._watchdog.wait(5)
        self._cluster = self._client = self._watchdog = None
        self._controller_ports = None
        self.node_addrs = self.node_fabrics = ()
        self.controller_ip = "127.0.0.1"
        self.shape = None
        self.engines = []
        self._engines_changed()
        self.busy = False
        self.state = "stopped"
        self._notify()

    def _engines_changed(self) -> None:
        """New engines, or none: what was pushed to the old ones and plans made for them are stale."""
        self.applied = None
        self.generation += 1

    def restart(self) -> None:
        shape = self.shape
        self.stop()
        if shape is not None:
            self.start(shape)

    # -- status --------------------------------------------------------------------

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        if self.state in ("idle", "busy"):
            self.state = "busy" if busy else "idle"
        self._notify()

    def status(self) -> dict[str, Any]:
        shape = self.shape
        alive_ids: set[int] = set()
        if self._client is not None:
            with contextlib.suppress(Exception):
                alive_ids = set(self._client.ids)
        ranks = []
        for e in self.engines:
            dead = e.engine_id not in alive_ids or (is_local_host(e.host) and not pid_alive(e.pid))
            ranks.append({"rank": e.rank, "engine_id": e.engine_id, "pid": e.pid, "host": e.host,
                          "state": "dead" if dead else ("busy" if self.busy else "idle")})
        return {
            "state": self.state,
            "engines": len(alive_ids),
            "expected": shape.world_size if shape else 0,
            "launcher": shape.launcher if shape else None,
            "hosts": list(shape.hosts) if shape else [],
            "ranks": ranks,
        }

    def _notify(self) -> None:
        if self.on_status is not None:
            with contextlib.suppress(Exception):
                self.on_status()


_EXIT_CODE = re.compile(r"Process name:\s*\[[^,\]]+,(\d+)\]\s*\n\s*Exit code:\s*(-?\d+)")
_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on\s+signal (\d+)(?: \(([^)]+)\))?")


def parse_death_notes(log: str) -> dict[int, str]:
    """Open MPI 5's (prterun's) messages about a rank that ended the job."""
    notes: dict[int, str] = {}
    for m in _EXIT_CODE.finditer(log):
        notes[int(m.group(1))] = f"exited with code {m.group(2)}"
    for m in _SIGNAL.finditer(log):
        name = f" ({m.group(3)})" if m.group(3) else ""
        notes[int(m.group(1))] = f"was killed by signal {m.group(2)}{name}"
    return notes


def lock_down(root: Path) -> None:
    """Connection files, logs and everything else of a cluster: readable by its owner only."""
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o700)
        for name in filenames:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(dirpath, name), 0o600)


def pid_alive(pid: int) -> bool:
    """Whether a process of this pid exists: a signal-0 probe, no /proc read (checked before every run)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _process_tree(pids: list[int]) -> list[psutil.Process]:
    procs: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
        except psutil.Error:
            continue
        procs[p.pid] = p
        with contextlib.suppress(psutil.Error):
            for c in p.children(recursive=True):
                procs[c.pid] = c
    return list(procs.values())


def _own_groups(pids: list[int]) -> set[int]:
    """The process groups of `pids` that are not this process's own group."""
    mine = os.getpgid(0)
    groups = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            pgid = os.getpgid(pid)
            if pgid != mine:
                groups.add(pgid)
    return groups


def _group_members(pgids: set[int]) -> list[psutil.Process]:
    if not pgids:
        return []
    members = []
    for p in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(p.pid) in pgids:
                members.append(p)
    return members


def _kill_all(procs: list[psutil.Process], grace: float = 3.0) -> None:
    alive = [p for p in procs if p.is_running()]
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(alive, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace)
