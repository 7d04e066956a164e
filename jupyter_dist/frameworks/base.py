"""What a framework module declares: its rank environment, its checks, its engine set-up."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # the plan builds these and hands them in: frameworks sit below it
    from jupyter_dist.plan.layout import Layout
    from jupyter_dist.plan.spec import RunSpec


@functools.cache
def cpu_count() -> int:
    """This host's core count, read once (each read costs tens of microseconds, three per run)."""
    return os.cpu_count() or 1


@dataclass(frozen=True)
class RunContext:
    """Everything a framework's pure functions may read about a run."""

    spec: RunSpec
    layout: Layout
    backend: str  # resolved: nccl, gloo or mpi
    cores_per_node: int = field(default_factory=cpu_count)
    inherited: frozenset[str] = frozenset()  # env keys the engines inherited from the kernel


class Framework:
    """Base of every framework module. Subclasses set the class variables and override hooks."""

    name: ClassVar[str]
    family: ClassVar[str]  # "torch", "mpi", "tensorflow", "torchrun"
    title: ClassVar[str] = ""
    order: ClassVar[int] = 1000  # place among the choices: built-ins 10..80, others after them
    module: ClassVar[str | None] = None  # import name the cell needs on the engines
    extra: ClassVar[str | None] = None  # pip extra that installs it
    engine_hooks: ClassVar[tuple[Callable[[], None], ...]] = ()  # engine functions run on every rank at set-up
    warm: ClassVar[bool] = True  # variables survive between cells

    def rank_env(self, ctx: RunContext, rank: int) -> dict[str, str]:
        raise NotImplementedError

    def check(self, ctx: RunContext) -> None:
        """Raise UsageError (one sentence naming the flag) when the run cannot work."""

    def before_start(self, ctx: RunContext) -> tuple[str, ...]:
        """One-line notes the user reads before the run starts (a first run that compiles, say)."""
        return ()

    def cell_ranks(self, ctx: RunContext) -> tuple[int, ...]:
        """Ranks that execute the cell (all, unless some only serve, as TF parameter servers)."""
        return tuple(range(ctx.layout.world_size))

    def cell_code(self, ctx: RunContext, code: str) -> str:
        """What the cell ranks execute; a per-node launcher (torchrun) wraps the user's code here."""
        return code

    def stale_engines(self, cluster: Any, spec: RunSpec, layout: Layout, backend: str) -> str | None:
        """Once engines of the run's shape are up: why they must restart first (a sentence), or None.
        `layout` is the run's on these engines (their ports and addresses), as the session plans it.
        TensorFlow's processes join one cluster for their life; other frameworks need nothing."""
        return None

    def before_layout(self, cluster: Any, spec: RunSpec) -> None:
        """Once the engines are up, before the run's ports are read into its layout: a framework
        whose launcher cannot share a port an earlier run still holds takes new ones here."""

    def install_hint(self) -> str:
        if self.extra:
            return f"pip install 'jupyter-dist[{self.extra}]'"
        return f"pip install {self.module}"


def torch_rank_env(ctx: RunContext, rank: int) -> dict[str, str]:
    """The torch.distributed `env://` variables of rank-env.md, plus OMP_NUM_THREADS."""
    lay = ctx.layout
    node = lay.node_of(rank)
    env = {
        "MASTER_ADDR": lay.master_addr,
        "MASTER_PORT": str(lay.master_port),
        "WORLD_SIZE": str(lay.world_size),
        "RANK": str(rank),
        "LOCAL_RANK": str(lay.local_rank_of(rank)),
        "NODE_RANK": str(node),
        "LOCAL_WORLD_SIZE": str(lay.procs_per_node),
        "GROUP_RANK": str(node),
    }
    env.update(omp_threads(ctx))
    return env


def omp_threads(ctx: RunContext) -> dict[str, str]:
    """`max(1, cores // P)` unless the user (flag or inherited environment) set it."""
    if "OMP_NUM_THREADS" in ctx.inherited or "OMP_NUM_THREADS" in ctx.spec.user_env:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, ctx.cores_per_node // ctx.layout.procs_per_node))}


def mpi_rank_env(ctx: RunContext, rank: int) -> dict[str, str]:
    """Open MPI's per-rank variables for the run's layout, and Azure ML's master-node variables."""
    lay = ctx.layout
    env = {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(lay.world_size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(lay.local_rank_of(rank)),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(lay.procs_per_node),
        "NODE_RANK": str(lay.node_of(rank)),
        "AZ_BATCHAI_MPI_MASTER_NODE": lay.master_addr,
    }
    if lay.nodes > 1:
        env["AZ_BATCH_MASTER_NODE"] = f"{lay.master_addr}:{lay.master_port}"
    return env
