"""Cells that several test modules run on real engines (tests/ is on pytest's pythonpath)."""

from __future__ import annotations

import textwrap


def ddp_cell(steps: int = 10, result: str = "params = torch.cat([p.detach().flatten() for p in model.parameters()])") -> str:
    """A small DDP training on gloo, each rank with its own data; `result` names what the cell leaves."""
    return textwrap.dedent(
        """
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo", init_method="env://")
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(dist.get_rank())   # each rank its own data
        for step in range(STEPS):
            x = torch.randn(16, 8, generator=gen)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            opt.zero_grad(); loss.backward(); opt.step()
        RESULT
        print(f"trained rank={dist.get_rank()} world={dist.get_world_size()}")
        """
    ).replace("STEPS", str(steps)).replace("RESULT", result)
