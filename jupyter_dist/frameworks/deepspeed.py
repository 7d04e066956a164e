"""DeepSpeed: the torch.distributed variables, so `deepspeed.init_distributed()` skips discovery.

On a host without GPUs DeepSpeed needs `DS_ACCELERATOR=cpu`; it then builds a small
shared-memory op the first time it starts its communication, which takes a minute or more.
`check` says so before the engines are set up, so the first run does not look hung.
`AZUREML_EXPERIMENT_ID` is never set: it would switch DeepSpeed into an Azure-only path.
"""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Mapping

from jupyter_dist.engine.torch_hooks import torch_idempotent_init
from jupyter_dist.frameworks.base import Framework, RunContext, torch_rank_env

SHM_OP = "deepspeed_shm_comm"


def accelerator_env(ctx: RunContext) -> dict[str, str]:
    """`DS_ACCELERATOR=cpu` without NCCL (no GPUs), unless the user or the engines set it."""
    if ctx.backend == "nccl" or "DS_ACCELERATOR" in ctx.inherited or "DS_ACCELERATOR" in ctx.spec.user_env:
        return {}
    return {"DS_ACCELERATOR": "cpu"}


def launcher_local_env(ctx: RunContext, rank: int) -> dict[str, str]:
    """Open MPI's local rank and size, as the run has them, where the engines inherited the launcher's.

    With virtual nodes on one host the launcher's value is the host-local one, and
    `deepspeed.initialize` refuses a LOCAL_RANK that disagrees with it.
    """
    if "OMPI_COMM_WORLD_LOCAL_RANK" not in ctx.inherited:
        return {}
    lay = ctx.layout
    return {"OMPI_COMM_WORLD_LOCAL_RANK": str(lay.local_rank_of(rank)),
            "OMPI_COMM_WORLD_LOCAL_SIZE": str(lay.procs_per_node)}


def extensions_root(user_env: Mapping[str, str] | None = None) -> str:
    """Where torch's JIT builds land (torch.utils.cpp_extension), without importing torch.

    `--env TORCH_EXTENSIONS_DIR=...` (in `user_env`) wins over the kernel's environment, as on the ranks.
    """
    env = {**os.environ, **(user_env or {})}
    if env.get("TORCH_EXTENSIONS_DIR"):
        return env["TORCH_EXTENSIONS_DIR"]
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "torch_extensions")


def shm_op_built(root: str | None = None) -> bool:
    root = root or extensions_root()
    tag = f"py{sys.version_info.major}{sys.version_info.minor}_*"
    return bool(glob.glob(os.path.join(root, tag, SHM_OP, f"{SHM_OP}*.so")))


class DeepSpeed(Framework):
    name = "deepspeed"
    family = "torch"
    title = "DeepSpeed"
    order = 50  # place in the choices (flags, panel, sidebar)
    module = "deepspeed"
    extra = "deepspeed"
    engine_hooks = (torch_idempotent_init,)

    def rank_env(self, ctx: RunContext, rank: int) -> dict[str, str]:
        return {**torch_rank_env(ctx, rank), **launcher_local_env(ctx, rank), **accelerator_env(ctx)}

    def before_start(self, ctx: RunContext) -> tuple[str, ...]:
        if accelerator_env(ctx) and ctx.layout.all_local and not shm_op_built(extensions_root(ctx.spec.user_env)):
            return (f"DeepSpeed builds its CPU communication op ({SHM_OP}) on this first run; "
                    "init_distributed() takes a minute or two while it compiles, once.",)
        return ()
