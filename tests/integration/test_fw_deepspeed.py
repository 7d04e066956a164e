"""-f deepspeed on real engines (2 nodes x 2 processes, CPU, gloo): ranks, world size, training, replicas."""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.engines, pytest.mark.timeout(420)]

TRAIN = textwrap.dedent(
    """
    import os, warnings
    warnings.filterwarnings("ignore")
    import torch, deepspeed
    import deepspeed.comm as ds_dist

    deepspeed.init_distributed()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "SGD", "params": {"lr": 0.05}}, "zero_optimization": {"stage": 0}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    gen = torch.Generator().manual_seed(ds_dist.get_rank())
    for _ in range(3):
        x = torch.randn(4, 4, generator=gen)
        loss = torch.nn.functional.mse_loss(engine(x), x.sum(1, keepdim=True))
        engine.backward(loss)
        engine.step()
    result = dict(rank=ds_dist.get_rank(), world=ds_dist.get_world_size(), engine_rank=engine.global_rank,
                  local_rank=engine.local_rank, dp=engine.dp_world_size, steps=engine.global_steps,
                  accelerator=deepspeed.get_accelerator().device_name(), backend=ds_dist.get_backend(),
                  params=torch.cat([p.detach().flatten() for p in engine.module.parameters()]))
    print(f"deepspeed rank={result['rank']} world={result['world']} steps={result['steps']}")
    """
)


def check(results):
    for r, res in enumerate(results):
        assert (res["rank"], res["world"], res["engine_rank"], res["local_rank"], res["dp"], res["steps"]) == (r, 4, r, r % 2, 4, 3)
        assert res["accelerator"] == "cpu" and res["backend"] == "gloo"
        assert bool((res["params"] == results[0]["params"]).all())  # data parallel: replicas agree


def test_deepspeed_trains_on_cpu(distrun, shell):
    out = distrun("-f deepspeed -N 2 -n 2 -o result --timeout 360", TRAIN).out
    check(shell.user_ns["result"])
    for r in range(4):
        assert f"[rank {r}|node {r // 2}] deepspeed rank={r} world=4 steps=3" in out


def test_rerun_and_environment(distrun, shell):
    distrun("-f deepspeed -N 2 -n 2 -o result --timeout 120", TRAIN)  # init_distributed again
    check(shell.user_ns["result"])
    distrun("-f deepspeed -N 2 -n 2 -o env", "import os\nenv = (os.environ.get('DS_ACCELERATOR'), 'AZUREML_EXPERIMENT_ID' in os.environ)")
    assert shell.user_ns["env"] == [("cpu", False)] * 4


AZURE_MPI = textwrap.dedent(
    """
    import os
    # as Azure ML's documentation has DeepSpeed code for an MPI job derive its environment
    os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
    os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
    os.environ["LOCAL_RANK"] = os.environ["OMPI_COMM_WORLD_LOCAL_RANK"]
    master = os.environ.get("AZ_BATCH_MASTER_NODE")
    if master:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = master.split(":")
    else:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = os.environ["AZ_BATCHAI_MPI_MASTER_NODE"], "6105"
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    """
)


def test_azureml_mpi_deepspeed_code(distrun, shell):
    distrun("-f mpi -N 2 -n 2", "import torch.distributed as d\nif d.is_initialized(): d.destroy_process_group()")
    distrun("-f mpi -N 2 -n 2 -o result --timeout 120", AZURE_MPI + TRAIN)
    check(shell.user_ns["result"])
