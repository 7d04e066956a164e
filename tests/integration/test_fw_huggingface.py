"""-f huggingface on real engines (2 nodes x 2 processes): Trainer on a tiny config-built model, no download.

The training run takes its layout from an Azure ML `PyTorchConfiguration` through `--config`.
"""

from __future__ import annotations

import textwrap

import pytest
from IPython.core.error import UsageError

import jupyter_dist

pytest.importorskip("transformers")
pytestmark = [pytest.mark.engines, pytest.mark.timeout(300)]

ENV = "--env HF_HUB_OFFLINE=1 --env TRANSFORMERS_VERBOSITY=error"
FLAGS = f"-f huggingface -N 2 -n 2 {ENV}"

TRAIN = textwrap.dedent(
    """
    import os, tempfile, warnings
    warnings.filterwarnings("ignore")
    import torch
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    class Synthetic(torch.utils.data.Dataset):
        def __len__(self):
            return 32
        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            return {"input_ids": torch.randint(0, 64, (8,), generator=g), "labels": i % 2}

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16, num_labels=2)
    model = BertForSequenceClassification(config)
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, max_steps=3,
                             use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
                             disable_tqdm=True, ddp_backend="gloo")
    trainer = Trainer(model=model, args=args, train_dataset=Synthetic())
    trainer.train()
    result = dict(process=args.process_index, world=args.world_size, local=args.local_process_index,
                  steps=trainer.state.global_step, distributed=str(args.parallel_mode),
                  params=torch.cat([p.detach().flatten() for p in model.parameters()]))
    print(f"hf rank={args.process_index} world={args.world_size} local={args.local_process_index}")
    """
)


def test_trainer_ranks_and_training(distrun, shell):
    from jupyter_dist.azureml import PyTorchConfiguration

    # as an Azure ML job has it: 4 processes in all over 2 nodes; the backend name in any case
    shell.user_ns["job"] = PyTorchConfiguration(communication_backend="GLOO", process_count=4, node_count=2)
    out = distrun(f"-f huggingface --config job {ENV} -o result --timeout 240", TRAIN).out
    spec = jupyter_dist.get_session().last.spec
    assert (spec.framework, spec.nodes, spec.procs_per_node, spec.backend) == ("huggingface", 2, 2, "gloo")
    results = shell.user_ns["result"]
    for r, res in enumerate(results):
        assert (res["process"], res["world"], res["local"], res["steps"]) == (r, 4, r % 2, 3)
        assert res["distributed"] == "ParallelMode.DISTRIBUTED"
        assert bool((res["params"] == results[0]["params"]).all())  # DDP: replicas agree
        assert f"[rank {r}|node {r // 2}] hf rank={r} world=4 local={r % 2}" in out


def test_config_errors_before_anything_starts(shell):
    from jupyter_dist.azureml import PyTorchConfiguration

    shell.user_ns["uneven"] = PyTorchConfiguration(communication_backend="Gloo", process_count=3, node_count=2)
    with pytest.raises(UsageError, match="--config uneven: process_count 3 does not divide evenly over node_count 2"):
        shell.run_cell_magic("distrun", "-f huggingface --config uneven", "pass")
    shell.user_ns["gpu_job"] = PyTorchConfiguration(process_count=4, node_count=2)  # Nccl, the SDK's default
    with pytest.raises(UsageError, match="nccl needs at least 2 CUDA GPUs per node"):
        shell.run_cell_magic("distrun", "-f huggingface --config gpu_job", "pass")


def test_script_with_local_rank_argument(distrun, tmp_path):
    script = tmp_path / "train_args.py"
    script.write_text(
        "import argparse, os\n"
        "from transformers import TrainingArguments\n"
        "p = argparse.ArgumentParser(); p.add_argument('--local_rank', type=int, default=-1)\n"
        "a = p.parse_args()\n"
        "args = TrainingArguments(output_dir='/tmp/jd-hf-out', use_cpu=True, report_to=[], ddp_backend='gloo')\n"
        "print('local_rank', a.local_rank, 'process', args.process_index, 'local', args.local_process_index)\n"
    )
    out = distrun(f"{FLAGS} --timeout 120 {script} --local_rank $LOCAL_RANK").out
    for r in range(4):
        assert f"[rank {r}|node {r // 2}] local_rank {r % 2} process {r} local {r % 2}" in out
