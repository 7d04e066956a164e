"""PyTorch Lightning: every engine is one of the Trainer's processes, launched "externally".

`LOCAL_RANK` in the environment tells Lightning not to start processes. An engine hook
(`jupyter_dist.engine.frameworks.lightning.patch_lightning`) wraps `Trainer.__init__` so that
the Trainer takes the run's environment and layout; see that module.
"""

from __future__ import annotations

from jupyter_dist.engine.frameworks.lightning import patch_lightning
from jupyter_dist.engine.torch_hooks import torch_idempotent_init
from jupyter_dist.frameworks.base import Framework, RunContext, torch_rank_env


class Lightning(Framework):
    name = "lightning"
    family = "torch"
    title = "PyTorch Lightning"
    order = 60  # place in the choices (flags, panel, sidebar)
    module = "lightning"
    extra = "lightning"
    engine_hooks = (torch_idempotent_init, patch_lightning)

    def rank_env(self, ctx: RunContext, rank: int) -> dict[str, str]:
        return torch_rank_env(ctx, rank)
