"""PyTorch DDP: engines are the ranks; the cell calls `init_process_group(init_method="env://")`."""

from __future__ import annotations

from jupyter_dist.engine.torch_hooks import torch_idempotent_init
from jupyter_dist.frameworks.base import Framework, RunContext, torch_rank_env


class PyTorch(Framework):
    name = "pytorch"
    family = "torch"
    title = "PyTorch DDP"
    order = 10  # place in the choices (flags, panel, sidebar)
    module = "torch"
    extra = "torch"
    engine_hooks = (torch_idempotent_init,)

    def rank_env(self, ctx: RunContext, rank: int) -> dict[str, str]:
        return torch_rank_env(ctx, rank)
