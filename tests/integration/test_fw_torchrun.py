"""-f torchrun on real engines: one torchrun agent per node (2 nodes x 2 workers), workers labelled by rank."""

from __future__ import annotations

import re
import textwrap

import pytest
from IPython.core.error import UsageError

from jupyter_dist.errors import RankFailure
from jupyter_dist.run.session import not_warm_note

pytestmark = [pytest.mark.engines, pytest.mark.timeout(240)]
NOT_WARM_NOTE = "jupyter-dist: " + not_warm_note("torchrun")

TRAIN = textwrap.dedent(
    """
    import os, torch, torch.distributed as dist
    import jupyter_dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")}
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(dist.get_rank())
    for step in range(3):
        x = torch.randn(8, 4, generator=gen)
        loss = model(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        jupyter_dist.report(step=step, samples=8, loss=loss.item())   # from the worker to the notebook's chart
    digest = round(float(sum(p.sum() for p in model.parameters())), 6)
    print("env", env, "elastic", "TORCHELASTIC_RUN_ID" in os.environ, "mpi", "OMPI_COMM_WORLD_RANK" in os.environ)
    print(f"trained rank={dist.get_rank()} world={dist.get_world_size()} digest={digest}")
    dist.barrier()
    dist.destroy_process_group()
    """
)


def test_workers_get_torchrun_env_and_agree(distrun):
    out = distrun("-f torchrun -N 2 -n 2 --timeout 180", TRAIN).out
    assert out.count(NOT_WARM_NOTE) == 1
    digests = set()
    for r in range(4):
        env = {"RANK": str(r), "LOCAL_RANK": str(r % 2), "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": str(r // 2)}
        assert f"[rank {r}|node {r // 2}] env {env} elastic True mpi False" in out
        m = re.search(rf"\[rank {r}\|node {r // 2}\] trained rank={r} world=4 digest=(\S+)", out)
        assert m, out
        digests.add(m.group(1))
    assert len(digests) == 1  # DDP kept the replicas identical
    assert "run summary: samples/s from report(), 4 rank(s)" in out  # every worker's report() arrived
    assert "jupyter-dist-metrics" not in out  # and was taken out of the workers' output


def test_rerun_says_nothing_new_and_runs(distrun):
    out = distrun("-f torchrun -N 2 -n 2 --timeout 180", "import os\nprint('again', os.environ['RANK'])").out
    assert NOT_WARM_NOTE not in out  # said once per session
    for r in range(4):
        assert f"[rank {r}|node {r // 2}] again {r}" in out


def test_failing_worker_named(shell, capsys):
    cell = "import os, time\nif os.environ['RANK'] == '3':\n    raise ValueError('bad shard')\ntime.sleep(1)\n"
    with pytest.raises(RankFailure) as info:
        shell.run_cell_magic("distrun", "-f torchrun -N 2 -n 2 --timeout 180", cell)
    err = capsys.readouterr().err
    text = str(info.value)
    assert "torchrun worker rank 3 (node 1, local rank 1) failed: ValueError: bad shard" in text
    assert "[rank 3|node 1] ValueError: bad shard" in err  # the worker's own traceback, under its rank
    shown = "\n".join(info.value._render_traceback_())  # what the notebook shows
    print(shown)
    worker = re.search(r'Traceback \(most recent call last\):\n  File "[^"]*distrun_cell\.py", line 3, in <module>\n'
                       r"    raise ValueError\('bad shard'\)\nValueError: bad shard", shown)
    assert worker, shown  # the failing worker's traceback, from its error file
    for plumbing in ("__import__", "_torchrun_agent", "jupyter_dist", "runpy", "selectors.py", "TorchrunWorkerError"):
        assert plumbing not in shown.split("\nRankFailure: ")[0], plumbing  # no frame of ours in the report


def test_script_mode_expands_local_rank(distrun, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import argparse, os\n"
        "p = argparse.ArgumentParser(); p.add_argument('--local_rank', type=int); p.add_argument('--tag')\n"
        "a = p.parse_args()\n"
        "assert a.local_rank == int(os.environ['LOCAL_RANK'])\n"
        "print('script', a.tag, a.local_rank, os.environ['RANK'])\n"
    )
    out = distrun(f"-f torchrun -N 2 -n 2 --timeout 180 {script} --local_rank $LOCAL_RANK --tag t").out
    for r in range(4):
        assert f"[rank {r}|node {r // 2}] script t {r % 2} {r}" in out


def test_after_a_warm_pytorch_group(distrun):
    """A process group that -f pytorch left on rank 0 (holding the master port) does not block torchrun."""
    distrun("-f pytorch -N 2 -n 2", "import torch.distributed as dist\ndist.init_process_group('gloo')")
    out = distrun("-f torchrun -N 2 -n 2 --timeout 180", "import os\nprint('ok', os.environ['RANK'])").out
    assert "[rank 3|node 1] ok 3" in out


def test_after_a_warm_ddp_model_that_keeps_the_store_open(distrun):
    """A DDP model left on the engines keeps its group's store listening on the master port even
    after the agent destroys the group: torchrun's rendezvous then takes another port."""
    distrun("-f pytorch -N 2 -n 2", "import torch, torch.distributed as dist\n"
            "from torch.nn.parallel import DistributedDataParallel as DDP\n"
            "dist.init_process_group('gloo')\nkept_model = DDP(torch.nn.Linear(2, 2))")
    out = distrun("-f torchrun -N 2 -n 2 --timeout 180", "import os\nprint('ok', os.environ['RANK'])").out
    assert "[rank 3|node 1] ok 3" in out
    # and back: every rank lost the old group alike, so a new one forms on all of them
    out = distrun("-f pytorch -N 2 -n 2 --timeout 120", "import torch, torch.distributed as dist\n"
                  "from torch.nn.parallel import DistributedDataParallel as DDP\n"
                  "dist.init_process_group('gloo')\nkept_model = DDP(torch.nn.Linear(2, 2))\n"
                  "t = torch.ones(1); dist.all_reduce(t); print('sum', int(t))").out
    assert all(f"[rank {r}|node {r // 2}] sum 4" in out for r in range(4))


def test_out_is_refused(shell):
    with pytest.raises(UsageError, match="-o x cannot bring variables back from -f torchrun"):
        shell.run_cell_magic("distrun", "-f torchrun -N 2 -n 2 -o x", "x = 1")
