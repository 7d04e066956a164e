"""Each framework's training script (Horovod, Accelerate, Lightning, DeepSpeed), run twice in warm engines
with equal results (1 node x 2 ranks).

TensorFlow's is in test_scripts_tensorflow.py, on engines of its own: a process cannot leave the
TensorFlow cluster it joined, and Horovod's rendezvous on rank 0 keeps the port TensorFlow's first
task would take (the cluster's first task port).

The scripts are written here in the style of the frameworks' own examples (synthetic data, no
downloads; no upstream code). What a second run would inherit from the first in a warm engine is
reset (engine.script_reset); a run that would not be equal fails here.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from script_runs import recorded_sinks, twice

pytestmark = [pytest.mark.engines, pytest.mark.timeout(300)]

HOROVOD = textwrap.dedent(
    """
    import argparse
    import json

    import torch
    import horovod.torch as hvd

    parser = argparse.ArgumentParser(description="Horovod toy regression")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", required=True, help="prefix of each rank's result file")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(42)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    gen = torch.Generator().manual_seed(hvd.rank())
    for step in range(args.steps):
        x = torch.randn(32, 8, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with open(f"{args.out}_{hvd.rank()}.json", "w") as f:
        json.dump({"loss": loss.item(), "weights": model.weight.detach().flatten().tolist()}, f)
    """
)

ACCELERATE = textwrap.dedent(
    """
    import argparse
    import json

    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed


    def main():
        parser = argparse.ArgumentParser(description="Accelerate toy regression")
        parser.add_argument("--out", required=True, help="prefix of each rank's result file")
        args = parser.parse_args()
        accelerator = Accelerator(cpu=True)
        set_seed(0)
        x = torch.randn(256, 4)
        data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
        loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for epoch in range(2):
            model.train()
            for xb, yb in loader:
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
        accelerator.wait_for_everyone()
        weights = accelerator.unwrap_model(model).weight.detach().flatten().tolist()
        with open(f"{args.out}_{accelerator.process_index}.json", "w") as f:
            json.dump({"rank": accelerator.process_index, "loss": loss.item(), "weights": weights}, f)
        accelerator.end_training()


    if __name__ == "__main__":
        main()
    """
)

LIGHTNING = textwrap.dedent(
    """
    import argparse
    import json
    import logging
    import os

    import torch
    import lightning as L


    class Regressor(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)


    if __name__ == "__main__":
        parser = argparse.ArgumentParser(description="Lightning toy regression")
        parser.add_argument("--out", required=True, help="prefix of each rank's result file")
        args = parser.parse_args()
        for name in ("lightning.pytorch", "lightning.fabric"):
            logging.getLogger(name).setLevel(logging.ERROR)
        L.seed_everything(0, verbose=False)
        x = torch.randn(256, 4)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
        model = Regressor()
        trainer = L.Trainer(accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)), strategy="ddp",
                            max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False)
        trainer.fit(model, loader)
        with open(f"{args.out}_{trainer.global_rank}.json", "w") as f:
            json.dump({"rank": trainer.global_rank, "steps": trainer.global_step,
                       "weights": model.net.weight.detach().flatten().tolist()}, f)
    """
)

DEEPSPEED = textwrap.dedent(
    """
    import argparse
    import json
    import warnings

    import deepspeed
    import torch

    warnings.filterwarnings("ignore")


    def main():
        parser = argparse.ArgumentParser(description="DeepSpeed toy regression")
        parser.add_argument("--out", required=True, help="prefix of each rank's result file")
        parser.add_argument("--local_rank", type=int, default=-1)
        parser = deepspeed.add_config_arguments(parser)
        args = parser.parse_args()
        deepspeed.init_distributed(dist_backend="gloo")
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        engine, _, loader, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(),
                                                    training_data=make_data())
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
        weights = torch.cat([p.detach().flatten() for p in engine.module.parameters()]).tolist()
        with open(f"{args.out}_{engine.global_rank}.json", "w") as f:
            json.dump({"steps": engine.global_steps, "loss": loss.item(), "weights": weights}, f)


    def make_data():
        x = torch.randn(128, 4, generator=torch.Generator().manual_seed(1))
        return torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))


    if __name__ == "__main__":
        main()
    """
)

# as DeepSpeed's examples pass it (--deepspeed_config ds_config.json); torch's own Adam, not a compiled op
DS_CONFIG = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
             "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},
             "zero_optimization": {"stage": 0}}


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    d = tmp_path_factory.mktemp("fw_scripts")
    for name, text in (("hvd.py", HOROVOD), ("acc.py", ACCELERATE), ("pl.py", LIGHTNING), ("ds.py", DEEPSPEED),
                       ("ds_config.json", json.dumps(DS_CONFIG))):
        (d / name).write_text(text)
    return d


@pytest.fixture
def sinks(shell):
    """The sinks of the runs in the test (their metrics)."""
    with recorded_sinks() as made:
        yield made


def test_horovod_twice_and_its_steps_counted(distrun, scripts, sinks):
    pytest.importorskip("horovod.torch")
    first, second = twice(distrun, scripts, "-f horovod", "hvd.py", "hvd")
    assert first == second and first[0]["weights"] == first[1]["weights"]
    for sink in sinks:  # the wrapped optimizer's 60 steps, within 10%
        counted = [len(sink.metrics.ranks[r].auto_t) for r in range(2)]
        print("horovod steps counted per rank:", counted, "of 60")
        assert all(54 <= n <= 66 for n in counted)


def test_accelerate_twice(distrun, scripts, sinks):
    pytest.importorskip("accelerate")
    first, second = twice(distrun, scripts, "-f huggingface", "acc.py", "acc")
    assert first == second and first[0]["weights"] == first[1]["weights"]
    assert [r["rank"] for r in first] == [0, 1]
    assert [len(sinks[-1].metrics.ranks[r].auto_t) for r in range(2)] == [16, 16]  # 2 epochs x 128/16 per rank


def test_lightning_twice(distrun, scripts):
    pytest.importorskip("lightning")
    first, second = twice(distrun, scripts, "-f lightning", "pl.py", "pl")
    assert first == second and first[0]["weights"] == first[1]["weights"]
    assert [r["steps"] for r in first] == [16, 16]


def test_deepspeed_twice(distrun, scripts, sinks):
    """A DeepSpeed script with its JSON config, on engines that ran other frameworks' scripts before."""
    pytest.importorskip("deepspeed")
    first, second = twice(distrun, scripts, "-f deepspeed", f"ds.py --deepspeed --deepspeed_config {scripts}/ds_config.json",
                          "ds")
    assert first == second and first[0]["weights"] == first[1]["weights"]
    assert [r["steps"] for r in first] == [8, 8]  # 128 samples, 2 ranks x 8 a step
    print("deepspeed steps counted per rank:", [len(sinks[-1].metrics.ranks[r].auto_t) for r in range(2)], "of 8")
