"""`%dist export`: the generated script and launchers, checked without engines.

The script's prelude is run for real (a plain `python` process each) under the environments that
torchrun, Open MPI, Azure ML and Slurm give, with a cell that reports what it sees.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from jupyter_dist import frameworks
from jupyter_dist.plan.defaults import RunDefaults
from jupyter_dist.plan.plan import Ports, layout_of
from jupyter_dist.plan.spec import parse_args, resolve
from jupyter_dist.run.session import DistSession, LastRun
from jupyter_dist.tools import export as E
from jupyter_dist.tools.export import run_env

KEYS = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR",
        "MASTER_PORT", "OMP_NUM_THREADS", "OMPI_COMM_WORLD_LOCAL_RANK", "TF_CONFIG", "A"]
ENV_CELL = f"import os, json\nseen = {{k: os.environ.get(k) for k in {KEYS!r}}}\nprint(json.dumps(seen))\n"
# Launcher variables of the test process itself must not leak into the scripts' runs.
LAUNCHER_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "PRTE_", "SLURM_", "AZ_", "TORCHELASTIC_", "JUPYTER_DIST_PROCS", "TF_CONFIG")


def make(line: str):
    return resolve(parse_args(line), RunDefaults(), mpiexec_found=True)


def build(line: str, code: str | None, fmt: str | None = None, path: Path | str = E.DEFAULT_SCRIPT, **kw):
    return E.build(make(line), code, E.ExportOptions(fmt, str(path), **kw))


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in E.LAYOUT_KEYS and not k.startswith(LAUNCHER_PREFIXES)}
    env.update(extra)
    return env


def run_script(path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(path), *args], env=env, cwd=path.parent,
                          capture_output=True, text=True, timeout=60)


def seen(path: Path, **env: str) -> dict[str, str | None]:
    proc = run_script(path, clean_env(**env))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- each format for a 2 x 2 PyTorch cell ---------------------------------------------------


def test_torchrun_format():
    exp = build("-f pytorch -N 2 -n 2", "print(1)", "torchrun")
    text = exp.launcher.text
    assert exp.launcher.path == "distrun_export.torchrun.sh" and exp.launcher.executable
    assert "-m torch.distributed.run --nnodes 2 --nproc_per_node 2" in text
    assert '--node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT"' in text
    assert 'MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"' in text and 'MASTER_PORT="${MASTER_PORT:-29500}"' in text
    assert "which runs: torchrun --nnodes 2 --nproc_per_node 2 --node_rank $NODE_RANK --master_addr 127.0.0.1 " \
           "--master_port 29500 distrun_export.py" in exp.summary()


def test_mpirun_format():
    exp = build("-f pytorch -N 2 -n 2", "print(1)", "mpirun")
    text = exp.launcher.text
    assert '-np 4 -x MASTER_ADDR -x MASTER_PORT -x JUPYTER_DIST_PROCS_PER_NODE' in text
    assert "export JUPYTER_DIST_PROCS_PER_NODE=2" in text
    assert "--host" not in text.split("exec", 1)[1]  # virtual nodes: one host
    # as-root and oversubscribe only as comments
    assert all(line.startswith("#") for line in text.splitlines() if "ALLOW_RUN_AS_ROOT" in line or "oversubscribe" in line)


def test_mpirun_with_hosts_names_them():
    exp = build("-f pytorch -N 2 -n 4 --hosts node-a,node-b --master-port 6000", "print(1)", "mpirun")
    assert "--host node-a:4,node-b:4" in exp.launcher.text
    assert 'MASTER_ADDR="${MASTER_ADDR:-node-a}"' in exp.launcher.text
    assert 'MASTER_PORT="${MASTER_PORT:-6000}"' in exp.launcher.text


def test_sbatch_format():
    exp = build("-f pytorch -N 2 -n 2", "print(1)", "sbatch")
    lines = exp.launcher.text.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert "#SBATCH --nodes=2" in lines and "#SBATCH --ntasks-per-node=2" in lines
    assert not any("--partition" in line for line in lines)
    text = exp.launcher.text
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in text
    assert "srun --nodes=2 --ntasks-per-node=2" in text


def test_sbatch_slurm_options_and_default_format():
    exp = build("-f pytorch -N 2 -n 2 --launcher slurm --partition gpu --time 01:30:00 --account proj-1", "x = 1")
    assert exp.format == "sbatch"
    for line in ("#SBATCH --partition=gpu", "#SBATCH --time=01:30:00", "#SBATCH --account=proj-1"):
        assert line in exp.launcher.text.splitlines()


def test_sbatch_torchrun_framework_runs_one_torchrun_per_node():
    text = build("-f torchrun -N 2 -n 2", "x = 1", "sbatch").launcher.text
    assert "#SBATCH --ntasks-per-node=2" in text
    assert "srun --nodes=2 --ntasks-per-node=1" in text and "--rdzv_backend c10d" in text


def test_sbatch_mpi_uses_mpirun():
    text = build("-f mpi -N 2 -n 2", "x = 1", "sbatch").launcher.text
    assert '"${MPIRUN:-mpirun}" -np 4' in text


@pytest.mark.parametrize("line", ["-f pytorch -N 2 -n 2", "-f torchrun -N 2 -n 2", "-f mpi -N 2 -n 2",
                                  "-f tensorflow -N 2 -n 2 --ps 1"])
def test_shell_launchers_pass_bash_n(tmp_path, line):
    formats = [f for f in ("torchrun", "mpirun", "sbatch") if not (f == "torchrun" and ("mpi" in line or "tensorflow" in line))]
    for fmt in formats:
        exp = build(line, "x = 1", fmt, tmp_path / "job.py")
        E.write(exp)
        proc = subprocess.run(["bash", "-n", exp.launcher.path], capture_output=True, text=True, timeout=10)
        assert proc.returncode == 0, (fmt, proc.stderr)
        assert os.access(exp.launcher.path, os.X_OK)


# -- Azure ML ----------------------------------------------------------------------------------

DIST_TYPES = ("pytorch", "mpi", "tensorflow")
# The fields of Azure ML's commandJob schema that the export writes, with their types and rules.
JOB_SCHEMA = {
    "type": "object",
    "required": ["$schema", "type", "code", "command", "environment", "compute", "resources", "distribution"],
    "properties": {
        "$schema": {"const": E.SCHEMA},
        "type": {"const": "command"},
        "display_name": {"type": "string"},
        "experiment_name": {"type": "string"},
        "code": {"type": "string"},
        "command": {"type": "string", "minLength": 1},
        "environment": {"type": "string", "pattern": "^azureml:"},
        "compute": {"type": "string", "pattern": "^azureml:"},
        "resources": {"type": "object", "required": ["instance_count"], "additionalProperties": False,
                      "properties": {"instance_count": {"type": "integer", "minimum": 1}}},
        "distribution": {
            "type": "object", "required": ["type"],
            "properties": {"type": {"enum": list(DIST_TYPES)}},
            "oneOf": [
                {"properties": {"type": {"enum": ["pytorch", "mpi"]},
                                "process_count_per_instance": {"type": "integer", "minimum": 1}},
                 "required": ["process_count_per_instance"], "additionalProperties": False},
                {"properties": {"type": {"const": "tensorflow"}, "worker_count": {"type": "integer", "minimum": 1},
                                "parameter_server_count": {"type": "integer", "minimum": 0}},
                 "required": ["worker_count", "parameter_server_count"], "additionalProperties": False},
            ],
        },
    },
    "additionalProperties": False,
}


def check_job(job: dict, world: int) -> None:
    """Required keys, types, allowed distribution types, and that the job has the run's world size."""
    for key in JOB_SCHEMA["required"]:
        assert key in job, key
    assert job["type"] == "command" and job["$schema"] == E.SCHEMA and job["code"] == "."
    assert isinstance(job["command"], str) and job["command"].startswith("python ")
    dist, instances = job["distribution"], job["resources"]["instance_count"]
    assert isinstance(instances, int) and instances >= 1
    assert dist["type"] in DIST_TYPES
    if dist["type"] == "tensorflow":
        assert dist["worker_count"] + dist["parameter_server_count"] == world
    else:
        assert isinstance(dist["process_count_per_instance"], int)
        assert dist["process_count_per_instance"] * instances == world
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.validate(job, JOB_SCHEMA)


@pytest.mark.parametrize(("line", "dist_type"), [
    ("-f pytorch -N 2 -n 2", "pytorch"), ("-f torchrun -N 3 -n 2", "pytorch"),
    ("-f mpi -N 2 -n 4", "mpi"), ("-f tensorflow -N 2 -n 2 --ps 1", "tensorflow"),
])
def test_azureml_job_fields(line, dist_type):
    yaml = pytest.importorskip("yaml")
    spec = make(line)
    exp = build(line, "x = 1", "azureml")
    assert exp.launcher.path == "distrun_export.azureml.yml" and not exp.launcher.executable
    job = yaml.safe_load(exp.launcher.text)
    check_job(job, spec.world_size)
    assert job["distribution"]["type"] == dist_type and job["resources"]["instance_count"] == spec.nodes
    assert job["command"] == "python distrun_export.py"
    if dist_type == "tensorflow":
        assert job["distribution"] == {"type": "tensorflow", "worker_count": 3, "parameter_server_count": 1}


def test_azureml_compute_environment_and_quoted_command():
    yaml = pytest.importorskip("yaml")
    spec = make("-f pytorch -N 2 -n 2 train.py --name 'a: b #c' --local_rank $LOCAL_RANK")
    exp = E.build(spec, None, E.ExportOptions("azureml", compute="gpu-cluster", environment="azureml:my-env@latest"))
    job = yaml.safe_load(exp.launcher.text)
    assert job["compute"] == "azureml:gpu-cluster" and job["environment"] == "azureml:my-env@latest"
    assert job["command"] == "python distrun_export.py --name 'a: b #c' --local_rank '$LOCAL_RANK'"
    assert "name yours" not in exp.launcher.text
    check_job(job, 4)


# -- the script: prelude under each launcher's environment ----------------------------------------


@pytest.fixture
def env_script(tmp_path):
    exp = build("-f pytorch -N 2 -n 2 --env 'A=x y'", ENV_CELL, "torchrun", tmp_path / "s.py")
    E.write(exp)
    return Path(exp.script.path)


@pytest.mark.timeout(60)
def test_prelude_under_torchrun(env_script):
    got = seen(env_script, RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", GROUP_RANK="1",
               MASTER_ADDR="10.0.0.1", MASTER_PORT="1234", OMP_NUM_THREADS="1")
    assert got["NODE_RANK"] == "1" and got["LOCAL_RANK"] == "1" and got["MASTER_ADDR"] == "10.0.0.1"
    assert got["MASTER_PORT"] == "1234" and got["OMP_NUM_THREADS"] == "1" and got["A"] == "x y"


@pytest.mark.timeout(60)
def test_prelude_under_mpirun_keeps_the_notebook_layout(env_script):
    # one host, four ranks: Open MPI says local rank 2 of 4, the exported layout says 0 of 2 on node 1
    got = seen(env_script, OMPI_COMM_WORLD_RANK="2", OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_LOCAL_RANK="2",
               OMPI_COMM_WORLD_LOCAL_SIZE="4", JUPYTER_DIST_PROCS_PER_NODE="2")
    assert (got["RANK"], got["WORLD_SIZE"], got["LOCAL_RANK"], got["NODE_RANK"], got["GROUP_RANK"]) == ("2", "4", "0", "1", "1")
    assert got["LOCAL_WORLD_SIZE"] == "2" and got["MASTER_ADDR"] == "127.0.0.1" and got["MASTER_PORT"] == "29500"
    assert got["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2))


@pytest.mark.timeout(60)
def test_prelude_under_azureml_mpi(env_script):
    got = seen(env_script, OMPI_COMM_WORLD_RANK="3", OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_LOCAL_RANK="1",
               OMPI_COMM_WORLD_LOCAL_SIZE="2", AZ_BATCH_MASTER_NODE="10.1.2.3:6105")
    assert (got["RANK"], got["LOCAL_RANK"], got["NODE_RANK"]) == ("3", "1", "1")
    assert (got["MASTER_ADDR"], got["MASTER_PORT"]) == ("10.1.2.3", "6105")


@pytest.mark.timeout(60)
def test_prelude_under_srun(env_script):
    got = seen(env_script, SLURM_PROCID="3", SLURM_NTASKS="4", SLURM_LOCALID="1", SLURM_NNODES="2",
               MASTER_ADDR="n001")
    assert (got["RANK"], got["WORLD_SIZE"], got["LOCAL_RANK"], got["LOCAL_WORLD_SIZE"], got["NODE_RANK"]) == ("3", "4", "1", "2", "1")
    assert got["MASTER_ADDR"] == "n001"


@pytest.mark.timeout(60)
def test_prelude_without_launcher_is_one_process(env_script):
    proc = run_script(env_script, clean_env())
    assert proc.returncode == 0 and "no launcher found" in proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (got["RANK"], got["WORLD_SIZE"], got["LOCAL_RANK"]) == ("0", "1", "0")


@pytest.mark.timeout(60)
def test_out_is_saved_per_rank(tmp_path):
    exp = build("-f pytorch -N 2 -n 2 -o result", "import os\nresult = {'rank': int(os.environ['RANK'])}", "mpirun",
                tmp_path / "s.py")
    E.write(exp)
    out = tmp_path / "out"
    out.mkdir()
    run = run_script(Path(exp.script.path), clean_env(RANK="1", WORLD_SIZE="2", JUPYTER_DIST_OUT_DIR=str(out)))
    assert run.returncode == 0, run.stderr
    assert pickle.loads((out / "result.rank1.pkl").read_bytes()) == {"rank": 1}
    assert "result.rank<RANK>.pkl" in exp.summary()


@pytest.mark.timeout(60)
def test_tensorflow_prelude_builds_tf_config(tmp_path):
    spec = make("-f tensorflow -N 2 -n 2 --ps 1")
    roles = E.tf_roles(spec, E._framework_envs(spec))
    worker = next(r for r, role in enumerate(roles) if role[0] == "worker")
    exp = build("-f tensorflow -N 2 -n 2 --ps 1", ENV_CELL, "mpirun", tmp_path / "tf.py")
    E.write(exp)
    got = seen(Path(exp.script.path), OMPI_COMM_WORLD_RANK=str(worker), OMPI_COMM_WORLD_SIZE="4",
               OMPI_COMM_WORLD_LOCAL_RANK=str(worker), OMPI_COMM_WORLD_LOCAL_SIZE="4", JUPYTER_DIST_PROCS_PER_NODE="2")
    tf = json.loads(got["TF_CONFIG"])
    assert tf["task"] == {"type": "worker", "index": roles[worker][1]} and tf["environment"] == "cloud"
    assert sorted(tf["cluster"]) == sorted({t for t, _ in roles})
    addrs = [a for v in tf["cluster"].values() for a in v]
    assert len(addrs) == len(set(addrs)) == 4  # every task its own host:port
    assert "JUPYTER_DIST_HOSTS" in exp.launcher.text


@pytest.mark.timeout(60)
def test_script_mode_wraps_the_script(tmp_path):
    (tmp_path / "train.py").write_text("import sys\nassert __name__ == '__main__'\nprint('argv', sys.argv[1:])\nfinal = 7\n")
    spec = make(f"-f pytorch -N 2 -n 2 -o final {tmp_path / 'train.py'} --local_rank $LOCAL_RANK --n ${{WORLD_SIZE}}")
    exp = E.build(spec, None, E.ExportOptions("torchrun", str(tmp_path / "job.py")))
    E.write(exp)
    assert "job.py --local_rank '$LOCAL_RANK' --n '${WORLD_SIZE}' \"$@\"" in exp.launcher.text
    run = run_script(Path(exp.script.path), clean_env(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1"),
                     "--local_rank", "$LOCAL_RANK", "--n", "${WORLD_SIZE}")
    assert run.returncode == 0, run.stderr
    assert "argv ['--local_rank', '1', '--n', '4']" in run.stdout
    assert pickle.loads((tmp_path / "final.rank3.pkl").read_bytes()) == 7


# -- the cell: IPython syntax, earlier cells ------------------------------------------------------


@pytest.mark.timeout(60)
def test_shell_escape_is_converted(tmp_path):
    exp = build("-f pytorch -N 1 -n 1", "!echo from-the-shell\nlines = !printf 'a\\nb\\n'\nprint(lines)", "torchrun",
                tmp_path / "s.py")
    E.write(exp)
    run = run_script(Path(exp.script.path), clean_env(RANK="0", WORLD_SIZE="1"))
    assert run.returncode == 0, run.stderr
    assert "from-the-shell" in run.stdout and "['a', 'b']" in run.stdout


@pytest.mark.parametrize(("cell", "words"), [
    ("%time x = 1", "the IPython magic %time on line 1"),
    ("x = 1\n%matplotlib inline", "the IPython magic %matplotlib on line 2"),
    ("x = 1\nx?", "IPython help (?) on line 2"),
    ("ip = get_ipython()", "get_ipython() on line 1"),
    ("n = 3\n!echo $n", "expands Python values"),
])
def test_magics_are_refused_in_one_sentence(cell, words):
    with pytest.raises(UsageError) as info:
        build("-f pytorch -N 1 -n 1", cell, "torchrun")
    message = str(info.value)
    assert words in message and message.count(". ") == 0 and message.endswith(".")


def test_names_from_earlier_cells_are_noted():
    exp = build("-f pytorch -N 2 -n 2", "import torch\nn = sum(p.numel() for p in model.parameters())\nprint(rank, n, len([1]))",
                "torchrun")
    assert any("model, rank" in note for note in exp.notes)
    assert "note: the cell uses model, rank" in exp.summary()
    assert not build("-f pytorch -N 2 -n 2", "import os\nx = [os.sep for _ in range(2)]", "torchrun").notes


def test_framework_constants_are_kept_and_said(monkeypatch, tmp_path):
    envs = [{"RANK": str(r), "MASTER_PORT": "1", "OMPI_COMM_WORLD_RANK": str(r), "DS_ACCELERATOR": "cpu",
             "PER_RANK": str(r)} for r in range(4)]
    assert E.framework_constants(envs) == {"DS_ACCELERATOR": "cpu"}
    monkeypatch.setattr(E, "_framework_envs", lambda spec: envs)
    exp = build("-f pytorch -N 2 -n 2 --env DS_ACCELERATOR=cuda", ENV_CELL, "torchrun", tmp_path / "s.py")
    assert any("DS_ACCELERATOR=cpu by default" in n for n in exp.notes)
    assert "'env': {'DS_ACCELERATOR': 'cuda'}" in exp.script.text  # --env wins over the framework


# -- bad input ------------------------------------------------------------------------------------


def test_unknown_format_names_the_flag():
    with pytest.raises(UsageError, match="--format must be one of torchrun, mpirun, sbatch, azureml, not 'slurm'"):
        E.parse_options(["--format", "slurm"])


@pytest.mark.parametrize("path", ["a;b.py", "train.txt", "$(x).py", "dir with space/x y.py", "line\nbreak.py"])
def test_bad_file_names(path):
    with pytest.raises(UsageError, match="FILE"):
        build("-f pytorch -N 2 -n 2", "x = 1", "torchrun", path)


def test_missing_folder(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        build("-f pytorch -N 2 -n 2", "x = 1", "torchrun", tmp_path / "nope" / "x.py")


def test_folder_with_spaces_is_quoted(tmp_path):
    folder = tmp_path / "my exports"
    folder.mkdir()
    exp = build("-f pytorch -N 2 -n 2 --launcher slurm", "x = 1", None, folder / "x.py")
    assert f"cd '{folder}' && sbatch x.sbatch.sh" in exp.summary()


def test_torchrun_refused_for_mpi_and_tensorflow():
    with pytest.raises(UsageError, match="-f mpi needs an MPI launcher"):
        build("-f mpi -N 2 -n 2", "x = 1", "torchrun")
    with pytest.raises(UsageError, match="TF_CONFIG"):
        build("-f tensorflow -N 2 -n 2", "x = 1", "torchrun")


def test_default_format_follows_the_framework():
    assert build("-f pytorch", "x = 1").format == "torchrun"
    assert build("-f mpi", "x = 1").format == "mpirun"


def test_bad_slurm_value_is_refused_in_the_export():
    with pytest.raises(UsageError, match=r"^%dist export: --time 'soon' is not a valid Slurm time\.$"):
        build("-f pytorch -N 2 -n 2 --launcher slurm --time soon", "x = 1")


def test_family_and_default_format_come_from_the_registry():
    for name, fw in frameworks.registry().items():
        assert run_env.family_of(name) == fw.family
    assert run_env.default_format(make("-f torchrun")) == "torchrun"
    assert run_env.default_format(make("-f tensorflow")) == "mpirun"
    assert run_env.default_format(make("-f mpi --launcher slurm")) == "sbatch"


def test_layout_and_ports_are_the_plans_with_torchrun_and_tf_defaults():
    spec = make("-f tensorflow -N 2 -n 2 --hosts node-a,node-b")
    assert run_env.export_ports(spec) == Ports(29500, (2222, 2223, 2224, 2225))
    assert run_env.export_layout(spec) == layout_of(spec, Ports(29500, (2222, 2223, 2224, 2225)))
    assert run_env.export_layout(spec).master_addr == "node-a"
    assert run_env.export_ports(make("-f pytorch --master-port 6000")).master == 6000


# -- the %dist export magic ---------------------------------------------------------------------


def test_magic_without_last_run():
    from jupyter_dist.ui.magics import DistMagics

    magics = DistMagics(None, DistSession())
    with pytest.raises(UsageError, match="no %%distrun run to export yet"):
        magics.dist("export")


def test_magic_writes_files_and_says_how_to_run(tmp_path, capsys):
    from jupyter_dist.ui.magics import DistMagics

    session = DistSession()
    session.last = LastRun(make("-f pytorch -N 2 -n 2"), "print('hi')")
    DistMagics(None, session).dist(f"export --format mpirun {tmp_path / 'job.py'}")
    out = capsys.readouterr().out
    assert (tmp_path / "job.py").is_file() and (tmp_path / "job.mpirun.sh").is_file()
    assert f"wrote {tmp_path / 'job.py'} and {tmp_path / 'job.mpirun.sh'}" in out
    assert "which runs: mpirun -np 4" in out
