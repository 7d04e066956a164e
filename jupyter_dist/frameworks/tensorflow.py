"""TensorFlow: `TF_CONFIG` per rank, every task at its own `host:port` (Layout.task_ports).

Without `--ps` every rank is a `worker` (worker 0 acts as chief) for
`MultiWorkerMirroredStrategy`. With `--ps K`, for `ParameterServerStrategy`: rank 0 is the
`chief` (the coordinator: the only rank that runs the cell), the last K ranks are `ps` and
the ranks between are `worker`s; workers and parameter servers only serve, from a
`tf.distribute.Server` that an engine hook starts in the background. TensorFlow makes one
MultiWorkerMirroredStrategy per process: a re-run of the cell gets the same strategy back.

A process joins one TensorFlow cluster for its life (a strategy made for another `TF_CONFIG`
hangs at its first collective), so when a run's TensorFlow cluster is not the one the engines
were given (`--ps` or the nodes changed) and they imported TensorFlow, the session restarts them
(`stale_engines`), with a line saying why.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, ClassVar

from IPython.core.error import UsageError

from jupyter_dist.engine.frameworks.tensorflow import imported, setup_tensorflow
from jupyter_dist.frameworks.base import Framework, RunContext, omp_threads

if TYPE_CHECKING:  # the plan builds these and hands them in: frameworks sit below it
    from jupyter_dist.plan.layout import Layout
    from jupyter_dist.plan.spec import RunSpec


def task_of(rank: int, world: int, ps: int) -> tuple[str, int]:
    """(task type, index) of `rank` in a world of `world` ranks with `ps` parameter servers."""
    if ps == 0:
        return ("worker", rank)
    if rank == 0:
        return ("chief", 0)
    if rank >= world - ps:
        return ("ps", rank - (world - ps))
    return ("worker", rank - 1)


def tf_config(ctx: RunContext, rank: int) -> dict[str, object]:
    lay = ctx.layout
    world, ps = lay.world_size, ctx.spec.ps
    ports = lay.task_ports or tuple(lay.master_port + 1 + r for r in range(world))
    cluster: dict[str, list[str]] = {}
    for r in range(world):
        kind, _ = task_of(r, world, ps)
        cluster.setdefault(kind, []).append(f"{lay.host_of(r)}:{ports[r]}")
    kind, index = task_of(rank, world, ps)
    return {"cluster": cluster, "task": {"type": kind, "index": index}, "environment": "cloud"}


def describe(layout: Layout, ps: int) -> str:
    """'4 workers', or 'a chief, 2 workers and 1 parameter server(s)'."""
    world = layout.world_size
    if not ps:
        return f"{world} workers"
    return f"a chief, {world - ps - 1} worker(s) and {ps} parameter server(s)"


def cluster_signature(ctx: RunContext) -> str:
    """Every rank's TensorFlow cluster and task: what a process cannot change once it joined."""
    tasks = [tf_config(ctx, r) for r in range(ctx.layout.world_size)]
    return json.dumps({"cluster": tasks[0]["cluster"], "tasks": [t["task"] for t in tasks]}, sort_keys=True)


class TensorFlow(Framework):
    name = "tensorflow"
    family = "tensorflow"
    title = "TensorFlow (tf.distribute)"
    order = 80  # place in the choices (flags, panel, sidebar)
    module = "tensorflow"
    extra = "tensorflow"
    engine_hooks = (setup_tensorflow,)

    # engines (their pids) -> (signature, description) of the TensorFlow cluster they were given
    _given: ClassVar[dict[tuple[int, ...], tuple[str, str]]] = {}

    def rank_env(self, ctx: RunContext, rank: int) -> dict[str, str]:
        return {"TF_CONFIG": json.dumps(tf_config(ctx, rank)), **omp_threads(ctx)}

    def check(self, ctx: RunContext) -> None:
        ps, world = ctx.spec.ps, ctx.layout.world_size
        if ps and world - ps < 2:
            raise UsageError(
                f"--ps {ps} with {world} rank(s) leaves no worker: ParameterServerStrategy needs a chief "
                f"(rank 0, which runs the cell), at least one worker and the {ps} parameter server(s), "
                f"so use at least {ps + 2} ranks."
            )

    def cell_ranks(self, ctx: RunContext) -> tuple[int, ...]:
        if ctx.spec.ps:
            return (0,)  # the chief coordinates; workers and parameter servers serve
        return tuple(range(ctx.layout.world_size))

    def stale_engines(self, cluster: Any, spec: RunSpec, layout: Layout, backend: str) -> str | None:
        """Called by the session once engines of the run's shape are up, with the run's layout on
        them: why they must restart (a sentence), or None. Engines that never imported TensorFlow
        joined nothing."""
        now = (cluster_signature(RunContext(spec, layout, backend)), describe(layout, spec.ps))
        engines = tuple(e.pid for e in cluster.engines)
        before = self._given.get(engines)
        self._given[engines] = now
        if before is None or before[0] == now[0] or not _imported_tensorflow(cluster):
            return None
        del self._given[engines]
        return (
            f"this run's TensorFlow cluster ({now[1]}) is not the one the engines joined ({before[1]}), and a "
            "process joins one TensorFlow cluster for its life: restarting the engines (variables on the ranks are lost)"
        )


def _imported_tensorflow(cluster: Any) -> bool:
    ids = [e.engine_id for e in cluster.engines]
    return any(cluster.client[ids].apply_sync(imported))
