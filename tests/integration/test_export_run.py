"""`%dist export` run for real: the exported scripts, under torchrun, mpirun and (a stand-in for)
Slurm, give what the same cell gave through `%%distrun` on the notebook's 2 x 2 engines."""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import psutil
import pytest
from cells import ddp_cell

from jupyter_dist.common.ports import free_ports

pytestmark = [pytest.mark.engines, pytest.mark.timeout(300)]

VENV_BIN = Path(sys.executable).parent
DDP_CELL = ddp_cell()
MPI_CELL = textwrap.dedent(
    """
    import os
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    got = (comm.rank, os.environ["OMPI_COMM_WORLD_LOCAL_RANK"], os.environ["NODE_RANK"],
           os.environ["AZ_BATCH_MASTER_NODE"].split(":")[0], comm.allreduce(comm.rank + 1))
    print("allreduce", got[-1])
    """
)
FAKE_SRUN = """\
import os, signal, subprocess, sys, time
import psutil
args, nodes, per, kill_on_bad_exit = sys.argv[1:], 1, 1, False
while args and args[0].startswith("--"):
    key, _, value = args.pop(0).partition("=")
    nodes = int(value) if key == "--nodes" else nodes
    per = int(value) if key == "--ntasks-per-node" else per
    kill_on_bad_exit = value != "0" if key == "--kill-on-bad-exit" else kill_on_bad_exit
procs = []
for r in range(nodes * per):
    env = dict(os.environ, SLURM_PROCID=str(r), SLURM_LOCALID=str(r % per), SLURM_NODEID=str(r // per),
               SLURM_NTASKS=str(nodes * per), SLURM_STEP_NUM_NODES=str(nodes))
    procs.append(subprocess.Popen(args, env=env))
# as srun does: with --kill-on-bad-exit, a task that exits nonzero ends the step's other tasks, each
# with all its processes (SIGTERM, then SIGKILL after a grace period)
while any(p.poll() is None for p in procs):
    if kill_on_bad_exit and any(p.returncode for p in procs):
        tree = [c for p in procs if p.poll() is None for c in psutil.Process(p.pid).children(recursive=True)]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in [psutil.Process(p.pid) for p in procs if p.poll() is None] + tree:
                try:
                    p.send_signal(sig)
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs([c for c in tree if c.is_running()], timeout=10)
            time.sleep(0.2)
    time.sleep(0.1)
sys.exit(max(abs(p.returncode) for p in procs))
"""


def launch_env(**extra: str) -> dict[str, str]:
    """This venv's python and mpirun, Open MPI allowed as root and oversubscribed; no launcher variables."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "SLURM_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK")}
    env.update(PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", PYTHON=sys.executable,
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe", MASTER_PORT=str(free_ports(1)[0]))
    env.update(extra)
    return env


# lines that say which process failed first, wherever they are in a long log
FIRST_FAILURE = re.compile(r"exitcode|terminate called|Aborted|Error waiting|ChildFailedError|Signal|error:", re.I)


def launch(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run a launcher; past `timeout` it and every process under it are killed and what it had
    printed comes back as a failed run (exit -9), so a hang is reported with its output."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        launcher = psutil.Process(proc.pid)
        for p in [*launcher.children(recursive=True), launcher]:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        out, err = proc.communicate()
        err += f"\n(test: the launcher was still running after {timeout:.0f} s: it and every process under it were killed)"
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def failure_report(proc: subprocess.CompletedProcess[str]) -> str:
    keys = [line for line in proc.stderr.splitlines() if FIRST_FAILURE.search(line)]
    return (f"exit {proc.returncode}\n--- stderr lines that matter:\n" + "\n".join(keys[:40])
            + f"\n--- stdout tail:\n{proc.stdout[-2000:]}\n--- stderr tail:\n{proc.stderr[-3000:]}")


def run(cmd: list[str], env: dict[str, str], cwd: Path) -> None:
    proc = launch(cmd, env, cwd)
    assert proc.returncode == 0, failure_report(proc)


def saved(folder: Path, name: str, world: int) -> list:
    return [pickle.loads((folder / f"{name}.rank{r}.pkl").read_bytes()) for r in range(world)]


def same_params(got: list, want: list) -> None:
    import torch

    assert len(got) == len(want) == 4
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w), (g - w).abs().max()


@pytest.fixture(scope="module")
def notebook_params(shell):
    """The DDP cell run once through %%distrun on 2 x 2 engines: each rank's trained parameters."""
    shell.run_cell_magic("distrun", "-f pytorch -N 2 -n 2 -o params", DDP_CELL)
    params = shell.user_ns["params"]
    assert all(bool((p == params[0]).all()) for p in params)
    return params


def export(shell, capsys, fmt: str, path: Path) -> str:
    capsys.readouterr()
    shell.run_line_magic("dist", f"export --format {fmt} {path}")
    return capsys.readouterr().out


def test_torchrun_export_two_node_commands(shell, capsys, notebook_params, tmp_path):
    out = export(shell, capsys, "torchrun", tmp_path / "ddp.py")
    assert "which runs: torchrun --nnodes 2 --nproc_per_node 2 --node_rank $NODE_RANK" in out
    env = launch_env()  # one MASTER_PORT for both nodes
    nodes = [subprocess.Popen(["bash", str(tmp_path / "ddp.torchrun.sh")], env=dict(env, NODE_RANK=str(n)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for n in (0, 1)]
    logs = [p.communicate(timeout=180)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(f"--- node {n}:\n{log[-3000:]}" for n, log in enumerate(logs))
    assert "trained rank=0 world=4" in logs[0] and "trained rank=3 world=4" in logs[1]
    same_params(saved(tmp_path, "params", 4), notebook_params)


def test_mpirun_export(shell, capsys, notebook_params, tmp_path):
    shell.run_cell_magic("distrun", "-f pytorch -N 2 -n 2 -o params", DDP_CELL)  # the last run again
    export(shell, capsys, "mpirun", tmp_path / "ddp.py")
    run(["bash", str(tmp_path / "ddp.mpirun.sh")], launch_env(), tmp_path)
    same_params(saved(tmp_path, "params", 4), notebook_params)


def test_mpirun_export_of_an_mpi_cell(shell, capsys, tmp_path):
    shell.run_cell_magic("distrun", "-f mpi -N 2 -n 2 -o got", MPI_CELL)
    want = shell.user_ns["got"]
    assert [g[1:3] for g in want] == [("0", "0"), ("1", "0"), ("0", "1"), ("1", "1")]
    export(shell, capsys, "mpirun", tmp_path / "hello.py")
    run(["bash", str(tmp_path / "hello.mpirun.sh")], launch_env(MASTER_ADDR="127.0.0.1"), tmp_path)
    got = saved(tmp_path, "got", 4)
    assert [g[:3] + g[4:] for g in got] == [w[:3] + w[4:] for w in want]
    assert all(g[3] == "127.0.0.1" and g[4] == 10 for g in got)


@pytest.fixture
def fake_slurm(tmp_path):
    """`srun` that starts every task here with SLURM_* set, and `scontrol show hostnames`."""
    bin_dir = tmp_path / "fake-slurm"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(f"#!{sys.executable}\n{FAKE_SRUN}")
    scontrol = bin_dir / "scontrol"
    scontrol.write_text("#!/bin/sh\necho 127.0.0.1\necho 127.0.0.1\n")
    for f in (srun, scontrol):
        f.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "4242", "SLURM_NNODES": "2",
            "SLURM_SUBMIT_DIR": str(tmp_path)}


def test_sbatch_export_under_a_stand_in_for_slurm(shell, capsys, notebook_params, tmp_path, fake_slurm):
    shell.run_cell_magic("distrun", "-f pytorch -N 2 -n 2 -o params", DDP_CELL)
    out = export(shell, capsys, "sbatch", tmp_path / "ddp.py")
    assert "sbatch ddp.sbatch.sh" in out
    run(["bash", str(tmp_path / "ddp.sbatch.sh")], launch_env(**fake_slurm), tmp_path)
    same_params(saved(tmp_path, "params", 4), notebook_params)


def test_sbatch_torchrun_per_node_under_a_stand_in_for_slurm(notebook_params, tmp_path, fake_slurm):
    from jupyter_dist.plan.defaults import RunDefaults
    from jupyter_dist.plan.spec import parse_args, resolve
    from jupyter_dist.tools import export as E

    spec = resolve(parse_args("-f torchrun -N 2 -n 2 -o params"), RunDefaults(), mpiexec_found=True)
    exp = E.build(spec, DDP_CELL, E.ExportOptions("sbatch", str(tmp_path / "ddp.py")))
    E.write(exp)
    assert "--rdzv_backend c10d" in exp.launcher.text
    proc = launch(["bash", exp.launcher.path], launch_env(**fake_slurm), tmp_path)
    if proc.returncode != 0 and trained_then_failed_at_teardown(proc):
        # Seen about once in 90 runs (in CI, 2 cores): every rank trained and saved, then torch's elastic
        # side failed on the way out: one torchrun agent's poll of the c10d store found it gone
        # (RendezvousConnectionError), or a worker died in gloo's teardown and the other node's agent,
        # left waiting, was ended by srun's --kill-on-bad-exit. Our script's work was done; the run is
        # repeated once, must then pass, and the first failure is kept as a warning in the test report.
        warnings.warn("torchrun failed after every rank saved its result; ran again once:\n" + failure_report(proc),
                      stacklevel=1)
        for stale in tmp_path.glob("params.rank*.pkl"):
            stale.unlink()
        proc = launch(["bash", exp.launcher.path], launch_env(**fake_slurm), tmp_path)
    assert proc.returncode == 0, failure_report(proc)
    same_params(saved(tmp_path, "params", 4), notebook_params)


def trained_then_failed_at_teardown(proc: subprocess.CompletedProcess[str]) -> bool:
    # each rank prints this line after its file is written
    return all(f"rank {r} saved params" in proc.stdout for r in range(4))
