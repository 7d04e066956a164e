"""Hugging Face Trainer (transformers + accelerate): the torch.distributed variables.

`TrainingArguments` reads `LOCAL_RANK` (and accelerate `RANK`, `WORLD_SIZE`) from the
environment; scripts that still take `--local_rank` get it in script mode as
`%distrun -f huggingface train.py --local_rank $LOCAL_RANK` (expanded per rank).
"""

from __future__ import annotations

from jupyter_dist.engine.torch_hooks import torch_idempotent_init
from jupyter_dist.frameworks.base import Framework, RunContext, torch_rank_env
from jupyter_dist.frameworks.deepspeed import launcher_local_env


class HuggingFace(Framework):
    name = "huggingface"
    family = "torch"
    title = "Hugging Face Trainer"
    order = 70  # place in the choices (flags, panel, sidebar)
    module = "transformers"
    extra = "huggingface"
    engine_hooks = (torch_idempotent_init,)

    def rank_env(self, ctx: RunContext, rank: int) -> dict[str, str]:
        return {**torch_rank_env(ctx, rank), **launcher_local_env(ctx, rank)}
