"""Every framework of `-f` across the nodes of a real Slurm cluster (tests/slurm_cluster.py, 2 nodes x 1).

tests/integration/test_slurm_nodes.py runs -f pytorch, mpi and torchrun there; this module runs one real
distributed step of each other framework (horovod, deepspeed, lightning, huggingface, tensorflow) on CPU:
tiny models, synthetic data, results equal on every rank. Each rank runs in its own node's network
namespace, and the address where the framework's ranks meet (MASTER_ADDR, Horovod's rendezvous,
TF_CONFIG's first worker) is node 0's as the other node reaches it: loopback there would not work.
One engine job serves the whole module (the layout stays the same); node 1 keeps the cluster's
profiles on a disk of its own, as in test_slurm_nodes.py.
"""

from __future__ import annotations

import json
import os
import textwrap
import time

import pytest
from lightning_cells import LIGHTNING_FIT
from slurm_cluster import WHERE, module_cluster

import jupyter_dist
from jupyter_dist.cluster.profile import state_dir
from jupyter_dist.errors import DistRunError

pytestmark = [pytest.mark.engines, pytest.mark.timeout(600)]

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(jupyter_dist.__file__))))
FLAGS = "--launcher slurm --time 15 -N 2 -n 1"


@pytest.fixture(scope="module")
def nodes(request):
    # node names resolve on the nodes: Horovod 0.28's Gloo needs it (docs/slurm.md, "Horovod across nodes")
    return module_cluster(request, 2, private={1: [str(state_dir() / "profiles")]}, resolve_names=True)


@pytest.fixture(scope="module")
def nshell(nodes, shell):
    """The module's shell, set up after (so stopped before) the Slurm nodes."""
    return shell


@pytest.fixture
def run(nshell, distrun, nodes, capsys):
    """`run(flags, cell)`: the cell (after WHERE) on the module's nodes; each rank's `got` back, checked to
    run in its own node's namespace with this checkout's code, and the time the cell took printed."""

    def go(flags: str, cell: str) -> list[dict]:
        t0 = time.monotonic()
        try:
            out = distrun(f"{FLAGS} {flags} -o got", WHERE + textwrap.dedent(cell) + "\ngot = dict(got, where=where)\n")
        except DistRunError as err:  # its report: each failed rank's traceback, crash or hung stack
            pytest.fail(f"{err}\n" + "\n".join(err.report))
        took = time.monotonic() - t0
        got = nshell.user_ns["got"]
        assert len(got) == 2, out
        for r, g in enumerate(got):
            w = g["where"]
            assert w["host"] == nodes.names[r] and w["addrs"] == [nodes.addrs[r]], (r, w)
            assert w["code"].startswith(HERE), w["code"]  # this checkout's code, not another one's
        with capsys.disabled():
            print(f"\n{flags.split()[1]} on 2 nodes x 1: {took:.1f} s")
        return got

    return go


def same(a, b) -> bool:
    return bool((a == b).all())


# last: TensorFlow cannot leave the cluster it joins (its server keeps the first task port)
TENSORFLOW = """
import json
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
task = json.loads(os.environ["TF_CONFIG"])["task"]
mine = tf.constant([float(task["index"] + 1)] * 2)
total = strategy.reduce("SUM", strategy.run(lambda: tf.identity(mine)), axis=None)  # across the workers
got = dict(task=task, replicas=strategy.num_replicas_in_sync, total=total.numpy().tolist())
"""


def test_horovod_across_two_nodes(run, nodes):
    pytest.importorskip("horovod.torch", reason="Horovod is not built here: `make horovod` builds it")
    got = run("-f horovod --timeout 240", HOROVOD)
    for r, g in enumerate(got):
        assert g["view"] == (r, 2, 0, r, 2) and g["total"] == 3.0, g
        assert g["where"]["env"]["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == nodes.addrs[0]  # the rendezvous on node 0
        assert g["where"]["env"]["HOROVOD_HOSTNAME"] == nodes.addrs[r]
        assert g["where"]["env"]["HOROVOD_GLOO_IFACE"] == "eth0"  # the interface toward node 0
        assert same(g["params"], got[0]["params"])  # broadcast + averaged gradients


DEEPSPEED = """
import warnings
warnings.filterwarnings("ignore")
import torch, deepspeed
import deepspeed.comm as ds_dist

deepspeed.init_distributed()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},  # no op to compile
          "zero_optimization": {"stage": 0}}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
x = torch.randn(4, 4, generator=torch.Generator().manual_seed(ds_dist.get_rank()))
engine.backward(torch.nn.functional.mse_loss(engine(x), x.sum(1, keepdim=True)))
engine.step()
got = dict(view=(ds_dist.get_rank(), ds_dist.get_world_size(), engine.dp_world_size, engine.global_steps),
           params=torch.cat([p.detach().flatten() for p in engine.module.parameters()]))
"""


def replicas_agree_meeting_at_node_0(got, nodes, view_of) -> None:
    """Each rank's MASTER_ADDR, NODE_RANK and Gloo interface; its `view` as `view_of(rank)`; its
    parameters equal to rank 0's (data parallel kept the replicas identical)."""
    for r, g in enumerate(got):
        env = g["where"]["env"]
        assert env["MASTER_ADDR"] == nodes.addrs[0] and env["NODE_RANK"] == str(r), (r, env)
        assert env["GLOO_SOCKET_IFNAME"] == "eth0", (r, env)  # the interface toward node 0, found on the node
        assert g["view"] == view_of(r), g
        assert same(g["params"], got[0]["params"])


def test_deepspeed_across_two_nodes(run, nodes):
    pytest.importorskip("deepspeed")
    got = run("-f deepspeed --timeout 300", DEEPSPEED)
    replicas_agree_meeting_at_node_0(got, nodes, lambda r: (r, 2, 2, 1))


LIGHTNING = LIGHTNING_FIT + "view, params = fit(devices=1, num_nodes=2)\ngot = dict(view=view, params=params)\n"


def test_lightning_across_two_nodes(run, nodes):
    pytest.importorskip("lightning")
    got = run("-f lightning --timeout 240", LIGHTNING)
    # (global rank, node rank, local rank, world, steps, cluster environment): the run's, not Slurm's or MPI's
    replicas_agree_meeting_at_node_0(got, nodes, lambda r: (r, r, 0, 2, 3, "RunEnvironment"))


HUGGINGFACE = """
import tempfile, warnings
warnings.filterwarnings("ignore")
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

class Synthetic(torch.utils.data.Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return {"input_ids": torch.randint(0, 64, (8,), generator=torch.Generator().manual_seed(i)), "labels": i % 2}

torch.manual_seed(0)
model = BertForSequenceClassification(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                                 num_attention_heads=2, intermediate_size=32,
                                                 max_position_embeddings=16, num_labels=2))
args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, max_steps=2, use_cpu=True,
                         report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True, ddp_backend="gloo")
trainer = Trainer(model=model, args=args, train_dataset=Synthetic())
trainer.train()
got = dict(view=(args.process_index, args.world_size, trainer.state.global_step, str(args.parallel_mode)),
           params=torch.cat([p.detach().flatten() for p in model.parameters()]))
"""


def test_huggingface_across_two_nodes(run, nodes):
    pytest.importorskip("transformers")
    got = run("-f huggingface --env HF_HUB_OFFLINE=1 --env TRANSFORMERS_VERBOSITY=error --timeout 240", HUGGINGFACE)
    replicas_agree_meeting_at_node_0(got, nodes, lambda r: (r, 2, 2, "ParallelMode.DISTRIBUTED"))


def test_tensorflow_across_two_nodes(run, nodes):
    pytest.importorskip("tensorflow")
    got = run("-f tensorflow --env TF_CPP_MIN_LOG_LEVEL=3 --timeout 180", TENSORFLOW)
    for r, g in enumerate(got):
        assert g["task"] == {"type": "worker", "index": r} and g["replicas"] == 2, g
        assert g["total"] == [3.0, 3.0], g  # 1 + 2, all-reduced across the nodes
        workers = json.loads(g["where"]["env"]["TF_CONFIG"])["cluster"]["worker"]
        # worker 0 (the chief of MultiWorkerMirroredStrategy) at node 0's address, each worker at its node's
        assert [a.rsplit(":", 1)[0] for a in workers] == nodes.addrs[:2], workers


HOROVOD = """
import torch
import horovod.torch as hvd

hvd.init()
torch.manual_seed(hvd.rank())                       # different initial weights on purpose
model = torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
x = torch.randn(8, 4, generator=torch.Generator().manual_seed(hvd.rank()))
loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
opt.zero_grad(); loss.backward(); opt.step()
got = dict(view=(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.cross_rank(), hvd.cross_size()),
           total=hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item(),
           params=torch.cat([p.detach().flatten() for p in model.parameters()]))
"""
