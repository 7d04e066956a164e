"""The rank environment tables of rank-env.md for pytorch and mpi, precedence and no leaking."""

from __future__ import annotations

import os

import pytest

from jupyter_dist import frameworks
from jupyter_dist.engine import setup as engine
from jupyter_dist.engine.script import expand_rank_vars
from jupyter_dist.frameworks import RunContext
from jupyter_dist.plan.defaults import RunDefaults
from jupyter_dist.plan.envs import compose, rank_environments
from jupyter_dist.plan.layout import build_layout
from jupyter_dist.plan.spec import parse_args, resolve

SHAPES = [(1, 1), (1, 4), (2, 2), (4, 1)]


def context(line: str, nodes: int, procs: int, cores: int = 8, inherited=frozenset()) -> RunContext:
    spec = resolve(parse_args(f"{line} -N {nodes} -n {procs}"), RunDefaults())
    layout = build_layout(nodes, procs, master_port=29500)
    return RunContext(spec, layout, "gloo", cores_per_node=cores, inherited=inherited)


@pytest.mark.parametrize(("nodes", "procs"), SHAPES)
def test_pytorch_table(nodes, procs):
    ctx = context("-f pytorch", nodes, procs)
    envs = rank_environments(ctx, frameworks.get("pytorch"), {})
    assert len(envs) == nodes * procs
    for r, env in envs.items():
        assert env["RANK"] == str(r)
        assert env["LOCAL_RANK"] == str(r % procs)
        assert env["NODE_RANK"] == env["GROUP_RANK"] == str(r // procs)
        assert env["WORLD_SIZE"] == str(nodes * procs)
        assert env["LOCAL_WORLD_SIZE"] == str(procs)
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["MASTER_PORT"] == "29500"
        assert env["OMP_NUM_THREADS"] == str(max(1, 8 // procs))
        assert not any(k.startswith("TORCHELASTIC_") for k in env)
        assert "AZUREML_EXPERIMENT_ID" not in env


@pytest.mark.parametrize(("nodes", "procs"), SHAPES)
def test_mpi_table(nodes, procs):
    ctx = context("-f mpi", nodes, procs)
    envs = rank_environments(ctx, frameworks.get("mpi"), {})
    for r, env in envs.items():
        assert env["OMPI_COMM_WORLD_RANK"] == str(r)
        assert env["OMPI_COMM_WORLD_SIZE"] == str(nodes * procs)
        assert env["OMPI_COMM_WORLD_LOCAL_RANK"] == str(r % procs)
        assert env["OMPI_COMM_WORLD_LOCAL_SIZE"] == str(procs)
        assert env["NODE_RANK"] == str(r // procs)
        assert env["AZ_BATCHAI_MPI_MASTER_NODE"] == "127.0.0.1"
        if nodes > 1:
            assert env["AZ_BATCH_MASTER_NODE"] == "127.0.0.1:29500"
        else:
            assert "AZ_BATCH_MASTER_NODE" not in env
        # what Azure ML's MPI examples derive
        node_rank = int(env["OMPI_COMM_WORLD_RANK"]) // procs
        assert node_rank == r // procs


def test_omp_threads_never_zero_and_user_wins():
    assert rank_environments(context("", 1, 4, cores=2), frameworks.get("pytorch"), {})[0]["OMP_NUM_THREADS"] == "1"
    env = rank_environments(context("--env OMP_NUM_THREADS=7", 1, 2), frameworks.get("pytorch"), {})[0]
    assert env["OMP_NUM_THREADS"] == "7"
    inherited = rank_environments(context("", 1, 2, inherited=frozenset({"OMP_NUM_THREADS"})), frameworks.get("pytorch"), {})
    assert "OMP_NUM_THREADS" not in inherited[0]


def test_precedence_user_over_framework_over_fabric():
    env = compose({"A": "fabric", "B": "fabric", "C": "fabric"}, {"B": "fw", "C": "fw"}, {"C": "user"})
    assert env == {"A": "fabric", "B": "fw", "C": "user"}
    ctx = context("--env MASTER_PORT=1234", 1, 2)
    envs = rank_environments(ctx, frameworks.get("pytorch"), {0: {"MASTER_PORT": "1", "GLOO_SOCKET_IFNAME": "lo"}})
    assert envs[0]["MASTER_PORT"] == "1234" and envs[0]["GLOO_SOCKET_IFNAME"] == "lo"


def test_horovod_binds_gloo_to_the_ranks_interface():
    """Horovod's Gloo reads HOROVOD_GLOO_IFACE only: across nodes it follows GLOO_SOCKET_IFNAME (fabric or --env)."""

    def context(line: str, nodes: int, procs: int) -> RunContext:
        spec = resolve(parse_args(f"{line} -N {nodes} -n {procs}"), RunDefaults())
        return RunContext(spec, build_layout(nodes, procs, ("10.0.0.2", "10.0.0.3"), master_port=29500), "gloo")

    envs = rank_environments(context("-f horovod", 2, 1), frameworks.get("horovod"), {0: {"GLOO_SOCKET_IFNAME": "eth0"},
                                                                                       1: {"GLOO_SOCKET_IFNAME": "ib0"}})
    assert [envs[r]["HOROVOD_GLOO_IFACE"] for r in (0, 1)] == ["eth0", "ib0"]
    user = rank_environments(context("-f horovod --env GLOO_SOCKET_IFNAME==bond0", 2, 1), frameworks.get("horovod"),
                             {0: {"GLOO_SOCKET_IFNAME": "eth0"}})
    assert user[0]["HOROVOD_GLOO_IFACE"] == "bond0"
    listed = rank_environments(context("-f horovod --env GLOO_SOCKET_IFNAME=eth0,eth1", 2, 1), frameworks.get("horovod"), {})
    assert "HOROVOD_GLOO_IFACE" not in listed[0]  # not one name: Horovod's own choice
    assert "HOROVOD_GLOO_IFACE" not in rank_environments(context("-f pytorch", 2, 1), frameworks.get("pytorch"),
                                                         {0: {"GLOO_SOCKET_IFNAME": "eth0"}})[0]


def test_no_leak_when_framework_changes(monkeypatch):
    monkeypatch.setattr(engine, "_state", {"rank": 0, "saved": {}})
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # inherited by the engine
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_RANK", raising=False)
    torch_env = rank_environments(context("-f pytorch", 1, 2), frameworks.get("pytorch"), {})[0]
    torch_env["OMP_NUM_THREADS"] = "1"
    engine.apply_env(torch_env)
    assert os.environ["RANK"] == "0" and os.environ["OMP_NUM_THREADS"] == "1"
    mpi_env = rank_environments(context("-f mpi", 1, 2, inherited=frozenset({"OMP_NUM_THREADS"})), frameworks.get("mpi"), {})[0]
    engine.apply_env(mpi_env)
    assert "RANK" not in os.environ and "MASTER_ADDR" not in os.environ
    assert os.environ["OMP_NUM_THREADS"] == "3"  # the inherited value is back
    assert os.environ["OMPI_COMM_WORLD_LOCAL_RANK"] == "0"
    engine.apply_env({})
    assert "OMPI_COMM_WORLD_LOCAL_RANK" not in os.environ


def test_expand_rank_vars():
    env = {"RANK": "3", "LOCAL_RANK": "1", "NODE_RANK": "1", "WORLD_SIZE": "4"}
    assert expand_rank_vars("--local_rank=$LOCAL_RANK", env) == "--local_rank=1"
    assert expand_rank_vars("${RANK}/$WORLD_SIZE", env) == "3/4"
    assert expand_rank_vars("$RANKING $HOME", env) == "$RANKING $HOME"
    assert expand_rank_vars("n$NODE_RANK", env) == "n1"


def test_framework_registry_has_core_frameworks():
    names = set(frameworks.registry())
    assert {"pytorch", "mpi"} <= names
