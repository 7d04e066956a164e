"""The Slurm engine job: its script as ipyparallel writes it, its options, and the engine wrapper."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from jupyter_dist.cluster.engines import check_shape
from jupyter_dist.cluster.launchers.slurm import (
    ENGINE_WRAPPER,
    JOB_ID_VAR,
    OPTIONS_VAR,
    SlurmJob,
    batch_template,
    engine_env,
    job_controller_ip,
    job_from,
    slurm_engine_launcher,
)
from jupyter_dist.cluster.shape import ClusterShape


def written_script(job: SlurmJob, tmp_path, n: int, mpiexec: str = "/opt/my env/bin/mpiexec") -> str:
    """The job script exactly as ipyparallel's Slurm launcher writes it before `sbatch`."""
    profile = tmp_path / "profile"
    profile.mkdir(exist_ok=True)
    launcher = slurm_engine_launcher()(work_dir=".", profile_dir=str(profile), cluster_id="jd-1-abc",
                                        batch_template=batch_template(job, mpiexec))
    launcher.write_batch_script(n)
    assert launcher.batch_file == str(profile / "slurm_engine.sbatch")  # never in the notebook's folder
    return Path(launcher.batch_file).read_text()


def sbatch_lines(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_layout_and_flags_become_sbatch_options(tmp_path):
    job = job_from(2, 3, (("partition", "gpu"), ("time", "1-02:00:00"), ("account", "proj_1")), environ={})
    script = written_script(job, tmp_path, 6)
    lines = sbatch_lines(script)
    assert lines[0] == "--job-name=jupyter-dist-jd-1-abc"
    assert lines[1:4] == ["--nodes=2", "--ntasks-per-node=3", "--ntasks=6"]
    assert lines[4].startswith("--output=") and lines[4].endswith(".log")
    assert lines[5:] == ["--export=ALL", "--partition=gpu", "--time=1-02:00:00", "--account=proj_1"]
    assert script.startswith("#!/bin/bash\n")


def test_script_runs_mpiexec_of_the_environment_over_the_allocation(tmp_path):
    script = written_script(job_from(2, 3, environ={}), tmp_path, 6)
    body = [line for line in script.splitlines() if not line.startswith("#")]
    launch = " ".join(body).replace("\\", " ")
    assert "exec '/opt/my env/bin/mpiexec' -n 6 --map-by ppr:3:node --bind-to none" in launch
    # every engine goes through the wrapper, as an MPI engine of this interpreter
    assert "bash -c 'export JUPYTER_DIST_SLURM_JOB_ID=\"${SLURM_JOB_ID:-}\"; unset ${!SLURM@}; exec \"$@\"'" in launch
    assert launch.rstrip().endswith("-m ipyparallel.engine --mpi")
    assert "{" not in script.replace("${SLURM_JOB_ID:-}", "").replace("${!SLURM@}", "")  # every field filled


def test_script_is_valid_bash(tmp_path):
    job = job_from(1, 2, (("time", "10"),), environ={OPTIONS_VAR: "--qos=debug --gres=gpu:2 --constraint='a|b'"})
    script = tmp_path / "job.sh"
    script.write_text(written_script(job, tmp_path, 2))
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sbatch_lines(script.read_text())[-3:] == ["--qos=debug", "--gres=gpu:2", "--constraint=a|b"]


@pytest.mark.parametrize(
    ("options", "environ", "flag"),
    [
        ((("partition", "gpu\n#SBATCH --x"),), {}, "--partition"),
        ((("time", "soon"),), {}, "--time"),
        ((("account", "a b"),), {}, "--account"),
        ((("qos", "x"),), {}, "--qos"),
        ((), {OPTIONS_VAR: "qos=debug"}, OPTIONS_VAR),
        ((), {OPTIONS_VAR: "--qos='unclosed"}, OPTIONS_VAR),
        ((), {OPTIONS_VAR: "--comment='two words'"}, OPTIONS_VAR),
    ],
)
def test_bad_options_fail_naming_where_they_came_from(options, environ, flag):
    with pytest.raises(UsageError, match=flag):
        job_from(1, 2, options, environ=environ)


def test_engine_wrapper_drops_slurms_variables_and_keeps_the_job_id():
    env = {"PATH": "/usr/bin:/bin", "SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_JOB_ID": "42",
           "SLURMD_NODENAME": "n1", "SLURM_JOB_NAME": "x", "RANK_KEEP": "1"}
    out = subprocess.run(["bash", "-c", ENGINE_WRAPPER, "jupyter-dist-engine", "env"], env=env,
                         capture_output=True, text=True, check=True).stdout
    seen = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert not [k for k in seen if k.startswith("SLURM")]
    assert seen[JOB_ID_VAR] == "42" and seen["RANK_KEEP"] == "1"


def test_engine_env_allows_tcp_only_across_nodes():
    base = {"OMPI_MCA_btl": "self,sm", "OMPI_ALLOW_RUN_AS_ROOT": "1"}
    one = engine_env(job_from(1, 2, environ={}), base)
    two = engine_env(job_from(2, 2, environ={}), base)
    assert one["OMPI_MCA_btl"] == "self,sm" and "OMPI_MCA_btl" not in two
    assert one["PYTHONUNBUFFERED"] == two["PYTHONUNBUFFERED"] == "1"
    assert two["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and base["OMPI_MCA_btl"] == "self,sm"


def test_controller_address_can_be_given():
    assert job_controller_ip(job_from(2, 2, environ={}), {"JUPYTER_DIST_CONTROLLER_IP": "10.1.2.3"}) == "10.1.2.3"
    with pytest.raises(UsageError, match="JUPYTER_DIST_CONTROLLER_IP"):
        job_controller_ip(job_from(2, 2, environ={}), {"JUPYTER_DIST_CONTROLLER_IP": "head-node"})


def test_a_bad_slurm_option_fails_in_the_shape_check_before_anything_starts():
    check_shape(ClusterShape("slurm", 2, (), slurm_nodes=1, slurm=(("time", "00:10:00"),)))
    with pytest.raises(UsageError, match="--time 'soon' is not a valid Slurm time"):
        check_shape(ClusterShape("slurm", 2, (), slurm_nodes=1, slurm=(("time", "soon"),)))
