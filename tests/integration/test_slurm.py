"""`%%distrun --launcher slurm` on a real single-host Slurm (Debian's slurm-wlm and munge).

The module starts its own munged, slurmctld and slurmd from a generated slurm.conf in a temporary
folder (SLURM_CONF), with this host as the only node (its real CPUs and memory, from `slurmd -C`)
and no cgroups, and stops them at the end even when a test fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_dist.common.ports import free_ports

pytestmark = [pytest.mark.engines, pytest.mark.timeout(600)]

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


def _node_line() -> str:
    """This host as `slurmd -C` sees it (NodeName=... CPUs=... RealMemory=...), without the uptime."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True, timeout=60).stdout
    return next(line for line in out.splitlines() if line.startswith("NodeName="))


def _slurm_conf(d: Path, ctld_port: int, slurmd_port: int) -> str:
    node = _node_line()
    name = node.split()[0].removeprefix("NodeName=")  # Slurm's short name for this host
    return textwrap.dedent(
        f"""\
        ClusterName=jdtest
        SlurmctldHost={socket.gethostname().split(".")[0]}(127.0.0.1)
        SlurmctldPort={ctld_port}
        SlurmdPort={slurmd_port}
        SlurmUser=root
        SlurmdUser=root
        AuthType=auth/munge
        CredType=cred/munge
        AuthInfo=socket={d}/munge.sock
        StateSaveLocation={d}/state
        SlurmdSpoolDir={d}/spool
        SlurmctldPidFile={d}/slurmctld.pid
        SlurmdPidFile={d}/slurmd.pid
        SlurmctldLogFile={d}/slurmctld.log
        SlurmdLogFile={d}/slurmd.log
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
        {node} NodeAddr=127.0.0.1 State=UNKNOWN
        PartitionName=debug Nodes={name} Default=YES MaxTime=INFINITE State=UP
        """
    )


def _logs(d: Path) -> str:
    parts = []
    for name in ("munged.log", "slurmctld.log", "slurmd.log"):
        p = d / name
        if p.exists():
            parts.append(f"--- {name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-20:]))
    return "\n".join(parts)


def _stop(pidfile: Path) -> None:
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


@pytest.fixture(scope="module", autouse=True)
def slurm() -> Iterator[Path]:
    """munged + slurmctld + slurmd for this module (autouse: set up before, torn down after, the shell)."""
    missing = [d for d in DAEMONS if shutil.which(d) is None and not Path("/usr/sbin", d).exists()]
    if missing:
        pytest.skip(f"Slurm is not installed (no {', '.join(missing)}): apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        pytest.skip("a test Slurm needs root: slurmd starts jobs as their user, and this one runs as SlurmUser=root")
    d = Path(tempfile.mkdtemp(prefix="jd-slurm-"))  # short: the munge socket path must fit in sun_path
    for sub in ("state", "spool"):
        (d / sub).mkdir()
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    ctld_port, slurmd_port = free_ports(2)
    conf = d / "slurm.conf"
    conf.write_text(_slurm_conf(d, ctld_port, slurmd_port))
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    try:
        # -f: run as root; every file it uses lives in d
        subprocess.run(["munged", "-f", f"--socket={d}/munge.sock", f"--key-file={key}", f"--log-file={d}/munged.log",
                        f"--pid-file={d}/munged.pid", f"--seed-file={d}/munged.seed"], check=True, timeout=60)
        subprocess.run(["slurmctld"], check=True, timeout=60)
        subprocess.run(["slurmd"], check=True, timeout=60)
        end = time.monotonic() + 90
        state = ""
        while time.monotonic() < end:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30).stdout.strip()
            if state == "idle":
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"Slurm did not come up (node state {state!r}):\n{_logs(d)}")
        yield d
    finally:
        subprocess.run(["scancel", "--user", str(os.getuid())], capture_output=True, timeout=60)
        for name in ("slurmd.pid", "slurmctld.pid", "munged.pid"):
            _stop(d / name)
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        shutil.rmtree(d, ignore_errors=True)


def _jobs() -> list[tuple[str, str, str]]:
    """(id, name, state) of every job in this module's Slurm."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True, timeout=30).stdout
    return [tuple(line.split()) for line in out.splitlines() if line.strip()]


TORCH_CELL = textwrap.dedent(
    """
    import os, torch, torch.distributed as dist
    from mpi4py import MPI
    dist.init_process_group("gloo", init_method="env://")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    from lightning.fabric.plugins.environments import SLURMEnvironment
    got = {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.item(), "mpi": MPI.COMM_WORLD.rank,
           "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR")},
           "slurm_vars": sorted(k for k in os.environ if k.startswith("SLURM")),
           "lightning_sees_slurm": SLURMEnvironment.detect(),
           "job": os.environ.get("JUPYTER_DIST_SLURM_JOB_ID"), "pid": os.getpid()}
    print(f"all_reduce {t.item():g} on rank {dist.get_rank()} of {dist.get_world_size()}")
    """
)


def test_pytorch_allreduce_in_a_slurm_job(distrun, shell):
    out = distrun("--launcher slurm --time 10 -f pytorch -N 1 -n 2 -o got", TORCH_CELL)
    got = shell.user_ns["got"]
    assert [g["rank"] for g in got] == [0, 1] and [g["mpi"] for g in got] == [0, 1]
    assert all(g["world"] == 2 and g["sum"] == 3.0 for g in got)
    for r, g in enumerate(got):
        assert g["env"] == {"RANK": str(r), "LOCAL_RANK": str(r), "NODE_RANK": "0", "WORLD_SIZE": "2",
                            "MASTER_ADDR": "127.0.0.1"}
        assert g["slurm_vars"] == [] and g["lightning_sees_slurm"] is False
    for r in range(2):
        assert f"all_reduce 3 on rank {r} of 2" in out.out
    # the engines are the one running Slurm job, started with the options given
    jobs = [j for j in _jobs() if j[1].startswith("jupyter-dist-")]
    assert len(jobs) == 1 and jobs[0][2] == "RUNNING"
    assert {g["job"] for g in got} == {jobs[0][0]}
    shown = subprocess.run(["scontrol", "show", "job", jobs[0][0]], capture_output=True, text=True, timeout=30).stdout
    assert "TimeLimit=00:10:00" in shown and "NumNodes=1" in shown and "NumTasks=2" in shown


def test_mpi_rank_is_run_rank(distrun, shell):
    before = [j for j in _jobs() if j[1].startswith("jupyter-dist-")]
    distrun(
        "--launcher slurm --time 10 -f mpi -N 1 -n 2 -o got",
        "from mpi4py import MPI\nimport os\n"
        "got = (MPI.COMM_WORLD.rank, int(os.environ['OMPI_COMM_WORLD_RANK']), int(os.environ['OMPI_COMM_WORLD_SIZE']),"
        " MPI.COMM_WORLD.allreduce(MPI.COMM_WORLD.rank + 1))",
    )
    got = shell.user_ns["got"]
    assert [g[0] for g in got] == [0, 1] and [g[1] for g in got] == [0, 1]
    assert all(g[2] == 2 and g[3] == 3 for g in got)
    # same layout and options: the warm engines (the same job) ran it
    assert [j for j in _jobs() if j[1].startswith("jupyter-dist-")] == before


def test_a_hung_rank_is_interrupted_and_the_job_stays(distrun, shell):
    from jupyter_dist.errors import RunTimeout
    from jupyter_dist.plan.defaults import STORE

    before = [j for j in _jobs() if j[1].startswith("jupyter-dist-")]
    with pytest.raises(RunTimeout):
        shell.run_cell_magic("distrun", "--launcher slurm --time 10 -f pytorch -N 1 -n 2 --timeout 3",
                             "import os, time\nif os.environ['RANK'] == '1':\n    time.sleep(600)\n")
    STORE.update(timeout=None)  # --timeout is remembered like every flag
    distrun("--launcher slurm --time 10 -f pytorch -N 1 -n 2 -o after", "after = int(os.environ['RANK'])")
    assert shell.user_ns["after"] == [0, 1]
    assert [j for j in _jobs() if j[1].startswith("jupyter-dist-")] == before  # interrupted, not resubmitted


def test_a_dead_kernel_leaves_no_job(distrun, shell):
    """The watchdog (what runs when the kernel is killed) cancels the engines' job, not only local pids."""
    import sys

    import jupyter_dist

    distrun("--launcher slurm --time 10 -f mpi -N 1 -n 2", "pass")
    cluster = jupyter_dist.get_session().cluster
    jobs = [j for j in _jobs() if j[1].startswith("jupyter-dist-")]
    assert len(jobs) == 1 and f"slurm:{jobs[0][0]}" in cluster._pidfile.read_text().split()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a kernel pid that no longer exists: the watchdog stops everything at once
    subprocess.run([sys.executable, "-m", "jupyter_dist.cluster.watchdog", str(gone.pid), str(cluster._pidfile)],
                   check=True, timeout=60)
    deadline = time.monotonic() + 30
    while [j for j in _jobs() if j[1].startswith("jupyter-dist-")] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [j for j in _jobs() if j[1].startswith("jupyter-dist-")]
    jupyter_dist.get_session().shutdown()


def test_bad_partition_fails_with_slurms_words(distrun):
    import psutil

    t0 = time.time()
    with pytest.raises(Exception, match="invalid partition"):
        distrun("--launcher slurm --partition nosuch -f mpi -N 1 -n 2", "pass")
    assert not [j for j in _jobs() if j[1].startswith("jupyter-dist-")]
    # the controller started just before sbatch failed: none of its processes (it forks its
    # schedulers a moment after it starts) outlives the failed start
    left = [p.pid for p in psutil.process_iter(["cmdline", "create_time"])
            if "ipyparallel.controller" in " ".join(p.info["cmdline"] or []) and p.info["create_time"] >= t0 - 1]
    assert not left, left


def test_a_job_that_ends_early_fails_the_start_with_its_output(distrun, monkeypatch):
    # --export=NONE: the job runs without the engines' environment, so Open MPI refuses to run as
    # root and the job ends before any engine registers; the run must say so, not wait it out
    monkeypatch.setenv("JUPYTER_DIST_SLURM_OPTIONS", "--export=NONE")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)the engines exited while starting.*root.*\[slurm job \d+: FAILED"):
        distrun("--launcher slurm -f mpi -N 1 -n 2", "pass")
    assert time.monotonic() - t0 < 90  # well before the 180 s start timeout
