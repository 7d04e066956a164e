"""-f horovod on real engines (2 nodes x 2 processes, Gloo): Horovod's own view of the layout, training.

Horovod has no wheels; `python -m jupyter_dist.frameworks.horovod` builds it (`make horovod`; `make test`
builds it before the tests, `make demo` never does). Without it, -f horovod stops before anything starts with
one sentence that says how to build it, and the tests that need it are skipped saying how to build it.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
from IPython.core.error import UsageError

import jupyter_dist

pytestmark = [pytest.mark.engines, pytest.mark.horovod, pytest.mark.timeout(300)]
NOT_BUILT = "Horovod is not built here: `make horovod` builds it (make test does, before the tests)"

TRAIN = textwrap.dedent(
    """
    import torch
    import horovod.torch as hvd

    hvd.init()
    torch.manual_seed(hvd.rank())                       # different initial weights on purpose
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(hvd.rank())
    for _ in range(3):
        x = torch.randn(8, 4, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad(); loss.backward(); opt.step()
    result = dict(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(), local_size=hvd.local_size(),
                  cross_rank=hvd.cross_rank(), cross_size=hvd.cross_size(), gloo=hvd.gloo_enabled(),
                  params=torch.cat([p.detach().flatten() for p in model.parameters()]))
    print(f"horovod rank {hvd.rank()} of {hvd.size()}, local {hvd.local_rank()}, node {hvd.cross_rank()}")
    """
)


def test_without_horovod_one_sentence(shell, monkeypatch):
    """A cell that imports horovod where it is not installed (None in sys.modules: Python's way to make an
    import fail): the install hint, before any engine starts."""
    monkeypatch.setitem(sys.modules, "horovod", None)
    with pytest.raises(UsageError) as info:
        shell.run_cell_magic("distrun", "-f horovod -N 2 -n 2", "import horovod.torch as hvd\nhvd.init()")
    assert str(info.value) == (
        "-f horovod needs horovod, which is not installed here: python -m jupyter_dist.frameworks.horovod builds "
        "horovod==0.28.1 against the torch installed here, in several minutes (as make horovod does; a plain pip "
        "install of it fails on torch 2.x, whose headers need C++17).")
    assert jupyter_dist.get_session().cluster.engines == []


def test_horovod_ranks_and_training(distrun, shell):
    pytest.importorskip("horovod.torch", reason=NOT_BUILT)
    out = distrun("-f horovod -N 2 -n 2 -o result --timeout 240", TRAIN).out
    results = shell.user_ns["result"]
    for r, res in enumerate(results):
        view = (res["rank"], res["size"], res["local_rank"], res["local_size"], res["cross_rank"], res["cross_size"])
        assert view == (r, 4, r % 2, 2, r // 2, 2) and res["gloo"]
        assert bool((res["params"] == results[0]["params"]).all())  # broadcast + averaged gradients
        assert f"[rank {r}|node {r // 2}] horovod rank {r} of 4, local {r % 2}, node {r // 2}" in out


def test_rerun(distrun, shell):
    pytest.importorskip("horovod.torch", reason=NOT_BUILT)
    distrun("-f horovod -N 2 -n 2 -o result --timeout 120", TRAIN)  # hvd.init() again in warm engines
    assert [r["rank"] for r in shell.user_ns["result"]] == [0, 1, 2, 3]
