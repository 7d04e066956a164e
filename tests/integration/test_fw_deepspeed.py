"""-f deepspeed on real engines (2 nodes x 2 processes, CPU, gloo): ranks, world size, training, replicas.

Also DeepSpeed code written for an Azure ML MPI job, run by `-f mpi` through `--config` with an
`MpiConfiguration`, and the note that DeepSpeed's first run on a CPU host compiles an op.
"""

from __future__ import annotations

import textwrap

import pytest

import jupyter_dist

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
              # torch's own Adam: DeepSpeed's FusedAdam would be compiled first (a minute and more on CPU)
              "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},
              "zero_optimization": {"stage": 0}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    gen = torch.Generator().manual_seed(ds_dist.get_rank())
    for _ in range(3):
        x = torch.randn(4, 4, generator=gen)
        loss = torch.nn.functional.mse_loss(engine(x), x.sum(1, keepdim=True))
        engine.backward(loss)
        engine.step()
    result = dict(rank=ds_dist.get_rank(), world=ds_dist.get_world_size(), engine_rank=engine.global_rank,
                  local_rank=engine.local_rank, dp=engine.dp_world_size, steps=engine.global_steps,
                  accelerator=deepspeed.get_accelerator().device_name(), backend=torch.distributed.get_backend(),
                  optimizer=type(engine.optimizer).__module__,
                  params=torch.cat([p.detach().flatten() for p in engine.module.parameters()]))
    print(f"deepspeed rank={result['rank']} world={result['world']} steps={result['steps']}")
    """
)


def check(results):
    for r, res in enumerate(results):
        assert (res["rank"], res["world"], res["engine_rank"], res["local_rank"], res["dp"], res["steps"]) == (r, 4, r, r % 2, 4, 3)
        assert res["accelerator"] == "cpu" and res["backend"] == "gloo" and res["optimizer"].startswith("torch.optim")
        assert bool((res["params"] == results[0]["params"]).all())  # data parallel: replicas agree


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
    """First in the module, on fresh engines: DeepSpeed keeps its first process group for the process,
    so here it is the one the Azure ML code made from Open MPI's variables."""
    from jupyter_dist.azureml import MpiConfiguration

    shell.user_ns["mpi_job"] = MpiConfiguration(process_count_per_node=2, node_count=2)
    # -f mpi, 2 nodes x 2 from the configuration; the first run may build DeepSpeed's op
    distrun("--config mpi_job -o result --timeout 360", AZURE_MPI + TRAIN)
    check(shell.user_ns["result"])
    assert jupyter_dist.get_session().last.spec.framework == "mpi"


def test_deepspeed_trains_on_cpu(distrun, shell):
    out = distrun("-f deepspeed -N 2 -n 2 -o result --timeout 240", TRAIN).out
    check(shell.user_ns["result"])
    for r in range(4):
        assert f"[rank {r}|node {r // 2}] deepspeed rank={r} world=4 steps=3" in out


def test_first_run_says_it_builds(distrun, shell, tmp_path):
    """With no built op in the ranks' extension cache, one line before anything starts says it compiles."""
    note = "jupyter-dist: DeepSpeed builds its CPU communication op (deepspeed_shm_comm) on this first run"
    cell = "import os\next = os.environ.get('TORCH_EXTENSIONS_DIR')\nprint('ready')"
    out = distrun(f"-f deepspeed -N 2 -n 2 --env TORCH_EXTENSIONS_DIR={tmp_path} -o ext", cell).out
    assert out.count(note) == 1 and out.index(note) < out.index("[rank 0|node 0] ready")
    assert shell.user_ns["ext"] == [str(tmp_path)] * 4
    out = distrun("-f deepspeed -N 2 -n 2 -o ext", cell).out  # the default cache has it since the runs above
    assert note not in out


def test_rerun_and_environment(distrun, shell):
    distrun("-f deepspeed -N 2 -n 2 -o result --timeout 120", TRAIN)  # init_distributed again
    check(shell.user_ns["result"])
    distrun("-f deepspeed -N 2 -n 2 -o env", "import os\nenv = (os.environ.get('DS_ACCELERATOR'), 'AZUREML_EXPERIMENT_ID' in os.environ)")
    assert shell.user_ns["env"] == [("cpu", False)] * 4
