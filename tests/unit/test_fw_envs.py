"""Rank environments of torchrun, deepspeed, lightning, huggingface, tensorflow and horovod (pure)."""

from __future__ import annotations

import json
import sys

import pytest
from IPython.core.error import UsageError

from jupyter_dist import frameworks
from jupyter_dist.engine.frameworks.horovod import NODES_VAR, host_plan
from jupyter_dist.engine.frameworks.lightning import layout_problem, run_layout
from jupyter_dist.engine.frameworks.torchrun_command import torchrun_command
from jupyter_dist.frameworks import RunContext
from jupyter_dist.frameworks.horovod import build_env
from jupyter_dist.frameworks.tensorflow import task_of
from jupyter_dist.frameworks.torchrun import launch_plan
from jupyter_dist.plan.defaults import RunDefaults
from jupyter_dist.plan.envs import rank_environments
from jupyter_dist.plan.layout import build_layout
from jupyter_dist.plan.spec import parse_args, resolve

SHAPES = [(1, 1), (1, 4), (2, 2), (4, 1)]
PORTS = (41000, 41001, 41002, 41003)


def context(line: str, nodes: int, procs: int, *, backend: str = "gloo", hosts: tuple[str, ...] = (),
            inherited: frozenset[str] = frozenset()) -> RunContext:
    spec = resolve(parse_args(f"-N {nodes} -n {procs} {line}"), RunDefaults())
    layout = build_layout(nodes, procs, hosts, master_port=29500, task_ports=PORTS[: nodes * procs])
    return RunContext(spec, layout, backend, cores_per_node=8, inherited=inherited)


def envs_of(line: str, nodes: int, procs: int, **kw) -> dict[int, dict[str, str]]:
    ctx = context(line, nodes, procs, **kw)
    return rank_environments(ctx, frameworks.get(line.split()[1]), {})


def test_all_frameworks_registered():
    assert set(frameworks.registry()) >= {"pytorch", "mpi", "torchrun", "deepspeed", "lightning", "huggingface",
                                          "tensorflow", "horovod"}


# -- torchrun ---------------------------------------------------------------------------

@pytest.mark.parametrize(("nodes", "procs"), SHAPES)
def test_torchrun_agent_env_has_only_node_and_master(nodes, procs):
    for r, env in envs_of("-f torchrun", nodes, procs).items():
        own = {k for k in env if not k.startswith("JUPYTER_DIST_")}
        assert own == {"NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"}
        assert env["NODE_RANK"] == str(r // procs)
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29500")
        assert env["OMP_NUM_THREADS"] == str(max(1, 8 // procs))  # not torchrun's 1


@pytest.mark.parametrize(("nodes", "procs"), SHAPES)
def test_torchrun_per_node_command(nodes, procs):
    ctx = context("-f torchrun", nodes, procs)
    fw = frameworks.get("torchrun")
    assert fw.cell_ranks(ctx) == tuple(n * procs for n in range(nodes))  # each node's local rank 0
    assert fw.warm is False
    plan = launch_plan(ctx)
    for node in range(nodes):
        cmd = torchrun_command(plan, node, "/x/cell.py", python="py", log_dir="/x/logs")
        assert cmd[:13] == ["py", "-m", "torch.distributed.run", "--nproc_per_node", str(procs), "--nnodes", str(nodes),
                            "--node_rank", str(node), "--master_addr", "127.0.0.1", "--master_port", "29500"]
        assert cmd[cmd.index("--tee") + 1] == "3" and cmd[cmd.index("--log-dir") + 1] == "/x/logs"
        assert cmd[-3:] == ["-m", "jupyter_dist.engine.frameworks.torchrun_agent", "/x/cell.py"]


def test_torchrun_script_mode_passes_arguments(tmp_path):
    script = tmp_path / "train.py"
    ctx = context(f"-f torchrun {script} --local_rank $LOCAL_RANK", 2, 2)
    plan = launch_plan(ctx)
    cmd = torchrun_command(plan, 1, plan["script"])
    assert cmd[-5:] == ["-m", "jupyter_dist.engine.frameworks.torchrun_agent", str(script), "--local_rank", "$LOCAL_RANK"]


def test_torchrun_refuses_out():
    with pytest.raises(UsageError, match="-o x cannot bring variables back from -f torchrun"):
        frameworks.get("torchrun").check(context("-f torchrun -o x", 2, 2))


def test_torchrun_worker_env_drops_mpi_launch_vars():
    from jupyter_dist.engine.frameworks.torchrun_agent import worker_env

    env = worker_env({"OMPI_COMM_WORLD_RANK": "1", "PMIX_RANK": "1", "OMPI_MCA_btl": "self,tcp", "NODE_RANK": "1"})
    assert env == {"OMPI_MCA_btl": "self,tcp", "NODE_RANK": "1", "PYTHONUNBUFFERED": "1"}


def test_torchrun_failure_from_error_file(tmp_path):
    from jupyter_dist.engine.frameworks.torchrun_agent import failure_message

    err = tmp_path / "none_x" / "attempt_0" / "1" / "error.json"
    err.parent.mkdir(parents=True)
    err.write_text(json.dumps({"message": {"message": "ValueError: bad", "extraInfo": {"timestamp": "5"}}}))
    assert failure_message(str(tmp_path), [], 1, 2, 1) == (
        "torchrun worker rank 3 (node 1, local rank 1) failed: ValueError: bad", True)
    summary = ["Root Cause (first observed failure):", "  rank      : 2 (local_rank: 0)", "  exitcode  : -9 (pid: 7)"]
    assert failure_message(str(tmp_path / "none"), summary, 1, 2, 1) == (
        "torchrun worker rank 2 (node 1, local rank 0) was killed by SIGKILL; its output is above.", False)


# -- deepspeed, lightning, huggingface -----------------------------------------------------

@pytest.mark.parametrize("name", ["deepspeed", "lightning", "huggingface"])
@pytest.mark.parametrize(("nodes", "procs"), SHAPES)
def test_torch_family_tables(name, nodes, procs):
    for r, env in envs_of(f"-f {name}", nodes, procs).items():
        assert env["RANK"] == str(r) and env["WORLD_SIZE"] == str(nodes * procs)
        assert env["LOCAL_RANK"] == str(r % procs) and env["NODE_RANK"] == env["GROUP_RANK"] == str(r // procs)
        assert env["LOCAL_WORLD_SIZE"] == str(procs)
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29500")
        assert not any(k.startswith("TORCHELASTIC_") for k in env)
        assert "AZUREML_EXPERIMENT_ID" not in env
        assert ("DS_ACCELERATOR" in env) == (name == "deepspeed")


def test_deepspeed_accelerator():
    assert envs_of("-f deepspeed", 1, 2)[0]["DS_ACCELERATOR"] == "cpu"
    assert "DS_ACCELERATOR" not in envs_of("-f deepspeed", 1, 2, backend="nccl")[0]
    assert envs_of("-f deepspeed --env DS_ACCELERATOR=cuda", 1, 2)[1]["DS_ACCELERATOR"] == "cuda"
    assert "DS_ACCELERATOR" not in envs_of("-f deepspeed", 1, 2, inherited=frozenset({"DS_ACCELERATOR"}))[0]


@pytest.mark.parametrize("name", ["deepspeed", "huggingface"])
def test_launcher_local_rank_follows_the_layout(name):
    """Engines under mpiexec inherit a host-local OMPI_COMM_WORLD_LOCAL_RANK; DeepSpeed checks it against LOCAL_RANK."""
    envs = envs_of(f"-f {name}", 2, 2, inherited=frozenset({"OMPI_COMM_WORLD_LOCAL_RANK"}))
    assert [envs[r]["OMPI_COMM_WORLD_LOCAL_RANK"] for r in range(4)] == ["0", "1", "0", "1"]
    assert {envs[r]["OMPI_COMM_WORLD_LOCAL_SIZE"] for r in range(4)} == {"2"}
    assert "OMPI_COMM_WORLD_LOCAL_RANK" not in envs_of(f"-f {name}", 2, 2)[0]


def test_deepspeed_build_note(tmp_path, monkeypatch):
    from jupyter_dist.frameworks.deepspeed import shm_op_built

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    (note,) = frameworks.get("deepspeed").before_start(context("-f deepspeed", 1, 2))
    assert note.startswith("DeepSpeed builds its CPU communication op")
    so = tmp_path / f"py{sys.version_info.major}{sys.version_info.minor}_cpu" / "deepspeed_shm_comm"
    so.mkdir(parents=True)
    (so / "deepspeed_shm_comm.so").write_text("")
    assert shm_op_built()
    assert frameworks.get("deepspeed").before_start(context("-f deepspeed", 1, 2)) == ()


def test_lightning_layout_check(monkeypatch):
    assert layout_problem(2, 2, (2, 2)) is None
    assert layout_problem(1, 2, (2, 2)) == (
        "Trainer(devices=1, num_nodes=2) does not match this run's layout (-N 2 -n 2): "
        "pass Trainer(devices=2, num_nodes=2) or change the %%distrun flags.")
    for key in ("JUPYTER_DIST_FRAMEWORK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    assert run_layout() is None
    monkeypatch.setenv("JUPYTER_DIST_FRAMEWORK", "lightning")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert run_layout() == (4, 2)
    monkeypatch.setenv("JUPYTER_DIST_FRAMEWORK", "mpi")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4")
    assert run_layout() == (1, 4)


# -- tensorflow -----------------------------------------------------------------------------

@pytest.mark.parametrize(("nodes", "procs"), SHAPES)
def test_tf_config_workers(nodes, procs):
    envs = envs_of("-f tensorflow", nodes, procs)
    world = nodes * procs
    for r, env in envs.items():
        config = json.loads(env["TF_CONFIG"])
        assert config["task"] == {"type": "worker", "index": r}
        assert config["environment"] == "cloud"
        assert config["cluster"] == {"worker": [f"127.0.0.1:{PORTS[i]}" for i in range(world)]}
    ctx = context("-f tensorflow", nodes, procs)
    assert frameworks.get("tensorflow").cell_ranks(ctx) == tuple(range(world))


@pytest.mark.parametrize(("nodes", "procs", "ps"), [(1, 4, 1), (2, 2, 1), (4, 1, 2), (1, 4, 2)])
def test_tf_config_parameter_servers(nodes, procs, ps):
    world = nodes * procs
    envs = envs_of(f"-f tensorflow --ps {ps}", nodes, procs)
    configs = [json.loads(envs[r]["TF_CONFIG"]) for r in range(world)]
    cluster = configs[0]["cluster"]
    assert all(c["cluster"] == cluster for c in configs)
    assert {k: len(v) for k, v in cluster.items()} == {"chief": 1, "worker": world - ps - 1, "ps": ps}
    addresses = [a for v in cluster.values() for a in v]
    assert len(set(addresses)) == world  # every task its own host:port
    assert configs[0]["task"] == {"type": "chief", "index": 0}
    assert [c["task"] for c in configs[1: world - ps]] == [{"type": "worker", "index": i} for i in range(world - ps - 1)]
    assert [c["task"] for c in configs[world - ps:]] == [{"type": "ps", "index": i} for i in range(ps)]
    for r, c in enumerate(configs):
        kind, index = c["task"]["type"], c["task"]["index"]
        assert cluster[kind][index] == f"127.0.0.1:{PORTS[r]}"
    assert frameworks.get("tensorflow").cell_ranks(context(f"-f tensorflow --ps {ps}", nodes, procs)) == (0,)


def test_tf_config_hosts():
    envs = envs_of("-f tensorflow", 2, 2, hosts=("gpu-a", "gpu-b"))
    cluster = json.loads(envs[3]["TF_CONFIG"])["cluster"]["worker"]
    assert cluster == ["gpu-a:41000", "gpu-a:41001", "gpu-b:41002", "gpu-b:41003"]


def test_tf_ps_needs_a_worker():
    assert task_of(1, 2, 1) == ("ps", 0)
    with pytest.raises(UsageError, match="--ps 1 with 2 rank"):
        frameworks.get("tensorflow").check(context("-f tensorflow --ps 1", 1, 2))
    frameworks.get("tensorflow").check(context("-f tensorflow --ps 1", 1, 3))


# -- horovod --------------------------------------------------------------------------------

@pytest.mark.parametrize(("nodes", "procs"), SHAPES)
def test_horovod_gloo_vars(nodes, procs):
    envs = envs_of("-f horovod", nodes, procs)
    for r, env in envs.items():
        assert env["HOROVOD_RANK"] == env["OMPI_COMM_WORLD_RANK"] == str(r)
        assert env["HOROVOD_SIZE"] == str(nodes * procs)
        assert env["HOROVOD_LOCAL_RANK"] == env["OMPI_COMM_WORLD_LOCAL_RANK"] == str(r % procs)
        assert env["HOROVOD_LOCAL_SIZE"] == str(procs)
        assert env["HOROVOD_CROSS_RANK"] == str(r // procs) and env["HOROVOD_CROSS_SIZE"] == str(nodes)
        assert env["HOROVOD_CONTROLLER"] == env["HOROVOD_CPU_OPERATIONS"] == "gloo"
        assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "127.0.0.1"
        assert env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == str(PORTS[0])
        assert env["HOROVOD_GLOO_IFACE"] == "lo"
        # virtual nodes on one host get distinct Horovod host names
        assert env["HOROVOD_HOSTNAME"] == ("127.0.0.1" if nodes == 1 else f"127.0.0.1-node{r // procs}")
    plan = host_plan(envs[0])
    assert plan == [(envs[r]["HOROVOD_HOSTNAME"], r, r % procs, r // procs, nodes * procs, procs, nodes)
                    for r in range(nodes * procs)]
    assert all(NODES_VAR not in envs[r] for r in range(1, nodes * procs))


def test_horovod_real_hosts_keep_their_names():
    envs = envs_of("-f horovod", 2, 1, hosts=("a", "b"))
    assert [envs[r]["HOROVOD_HOSTNAME"] for r in range(2)] == ["a", "b"]
    assert "HOROVOD_GLOO_IFACE" not in envs[0]


def test_horovod_build_env(tmp_path, monkeypatch):
    """The switches that let Horovod 0.28.1 compile against torch 2.x: C++17 through CMake, Gloo and PyTorch only."""
    import subprocess

    monkeypatch.delenv("MAKEFLAGS", raising=False)
    monkeypatch.setenv("HOROVOD_WITHOUT_MPI", "0")  # the user's choice wins
    env = build_env(str(tmp_path), "/usr/bin/cmake", 2)
    assert env["HOROVOD_WITH_PYTORCH"] == env["HOROVOD_WITH_GLOO"] == "1"
    assert env["HOROVOD_WITHOUT_TENSORFLOW"] == env["HOROVOD_WITHOUT_MXNET"] == "1"
    assert env["HOROVOD_WITHOUT_MPI"] == "0" and env["MAKEFLAGS"] == "-j2"
    include = (tmp_path / "cxx17.cmake").read_text()
    assert 'CMAKE_CXX14_STANDARD_COMPILE_OPTION "-std=c++17"' in include
    # the wrapper adds the include to configure runs only
    wrapper = env["HOROVOD_CMAKE"]
    (tmp_path / "fake").write_text('#!/bin/sh\necho "$@"\n')
    (tmp_path / "fake").chmod(0o755)
    env = build_env(str(tmp_path), str(tmp_path / "fake"), 2)
    configure = subprocess.run([wrapper, "-S", "src"], capture_output=True, text=True, check=True).stdout
    assert configure.split() == [f"-DCMAKE_PROJECT_INCLUDE={tmp_path / 'cxx17.cmake'}", "-S", "src"]
    build = subprocess.run([wrapper, "--build", "b"], capture_output=True, text=True, check=True).stdout
    assert build.split() == ["--build", "b"]
    monkeypatch.setenv("MAKEFLAGS", "-j1")
    assert build_env(str(tmp_path), "cmake", 8)["MAKEFLAGS"] == "-j1"


def test_missing_framework_is_one_sentence(monkeypatch):
    """A framework that is not installed: one sentence naming it and how to install it."""
    import importlib.util

    from jupyter_dist.run.session import DistSession

    real = importlib.util.find_spec
    missing = {"horovod", "deepspeed", "tensorflow", "lightning", "transformers"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in missing else real(name, *a))
    session = DistSession()
    expected = {
        "horovod": "-f horovod needs horovod, which is not installed here: python -m jupyter_dist.frameworks.horovod "
                   "builds horovod==0.28.1 against the torch installed here",
        "deepspeed": "-f deepspeed needs deepspeed, which is not installed here: pip install 'jupyter-dist[deepspeed]'.",
        "tensorflow": "-f tensorflow needs tensorflow, which is not installed here: pip install 'jupyter-dist[tensorflow]'.",
        "lightning": "-f lightning needs lightning, which is not installed here: pip install 'jupyter-dist[lightning]'.",
        "huggingface": "-f huggingface needs transformers, which is not installed here: "
                       "pip install 'jupyter-dist[huggingface]'.",
    }
    for name, start in expected.items():
        spec = resolve(parse_args(f"-f {name} -N 1 -n 2"), RunDefaults())
        with pytest.raises(UsageError) as info:
            session.prepare(spec, "pass")
        message = str(info.value)
        assert message.startswith(start) and message.count(". ") == 0, message
