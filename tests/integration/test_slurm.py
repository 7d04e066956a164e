"""`%%distrun --launcher slurm` on a real single-host Slurm (Debian's slurm-wlm and munge).

The module starts its own munged, slurmctld and slurmd (tests/slurm_cluster.py, no namespaces) from a
generated slurm.conf in a temporary folder (SLURM_CONF), with this host as the only node (its real
CPUs and memory, from `slurmd -C`) and no cgroups, and stops them at the end even when a test fails.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster, missing_tools

pytestmark = [pytest.mark.engines, pytest.mark.timeout(600)]


@pytest.fixture(scope="module", autouse=True)
def slurm(request) -> Path:
    """munged + slurmctld + slurmd for this module (autouse: set up before, torn down after, the shell)."""
    if missing := missing_tools(namespaces=False):
        pytest.skip(f"Slurm is not installed (no {', '.join(missing)}): apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        pytest.skip("a test Slurm needs root: slurmd starts jobs as their user, and this one runs as SlurmUser=root")
    cluster = SlurmCluster(1, namespaces=False)
    request.addfinalizer(cluster.destroy)  # before anything exists, so a half set-up is removed too
    cluster.create()
    return cluster.dir


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
