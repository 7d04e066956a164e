"""A ninth framework, as a third-party package would write it (docs/architecture.md shows it):
PyTorch RPC, where each rank calls `rpc.init_rpc(os.environ["RPC_WORKER_NAME"], rank=..., world_size=...)`.

Registered through the `jupyter_dist.frameworks` entry point group by the tests that use it.
"""

from __future__ import annotations

from jupyter_dist.engine.torch_hooks import torch_idempotent_init
from jupyter_dist.frameworks.base import Framework, RunContext, torch_rank_env


class PyTorchRpc(Framework):
    name = "rpc"
    family = "torch"
    title = "PyTorch RPC"
    module = "torch"
    extra = "torch"
    engine_hooks = (torch_idempotent_init,)

    def rank_env(self, ctx: RunContext, rank: int) -> dict[str, str]:
        return {**torch_rank_env(ctx, rank), "RPC_WORKER_NAME": f"worker{rank}"}
