"""torchrun: one `torch.distributed.run` agent per node; its workers are new processes each run.

The local-rank-0 engine of each node is the node's launcher: it writes the cell to a script and
runs torchrun over it as a subprocess, streaming every worker's lines under the worker's global
rank. The engines themselves carry only what the agent needs (`NODE_RANK`, `MASTER_ADDR`,
`MASTER_PORT`); torchrun sets `RANK`, `LOCAL_RANK`, `TORCHELASTIC_*` and the rest for its workers.
"""

from __future__ import annotations

import os
from typing import Any

from IPython.core.error import UsageError

from jupyter_dist.common.ports import port_in_use
from jupyter_dist.frameworks.base import Framework, RunContext, omp_threads
from jupyter_dist.plan.spec import RunSpec

AGENT = "jupyter_dist.engine.frameworks.torchrun_agent"
ROLE = "default"  # torchrun's role name: its tee prefix is "[default<local rank>]:"

NOT_WARM_NOTE = (
    "jupyter-dist: -f torchrun starts new worker processes on every run: variables the cell "
    "defines do not survive it (use -f pytorch to keep state on warm engines)."
)


def launch_plan(ctx: RunContext) -> dict[str, Any]:
    """What every node's agent needs, the same for all nodes (each reads its NODE_RANK)."""
    lay = ctx.layout
    plan: dict[str, Any] = {
        "nproc_per_node": lay.procs_per_node,
        "nnodes": lay.nodes,
        "master_addr": lay.master_addr,
        "master_port": lay.master_port,
        "script": None,
        "args": [],
    }
    if ctx.spec.script is not None:
        plan["script"] = os.path.abspath(ctx.spec.script)
        plan["args"] = list(ctx.spec.script_args)
    return plan


def torchrun_args(plan: dict[str, Any], node: int) -> list[str]:
    """The per-node options of rank-env.md's command line, in its order."""
    return [
        "--nproc_per_node", str(plan["nproc_per_node"]),
        "--nnodes", str(plan["nnodes"]),
        "--node_rank", str(node),
        "--master_addr", str(plan["master_addr"]),
        "--master_port", str(plan["master_port"]),
    ]


def torchrun_command(plan: dict[str, Any], node: int, script: str, *, python: str = "python",
                     log_dir: str | None = None) -> list[str]:
    """`python -m torch.distributed.run ... SCRIPT ARGS` for `node`.

    Workers run through this package's small wrapper (`-m AGENT SCRIPT ARGS`): it expands
    `$LOCAL_RANK`-style arguments per worker and records a failing worker's error in torchrun's
    error file. `--tee 3` makes torchrun echo each worker's lines with its local rank.
    """
    cmd = [python, "-m", "torch.distributed.run", *torchrun_args(plan, node), "--role", ROLE, "--tee", "3"]
    if log_dir is not None:
        cmd += ["--log-dir", log_dir]
    return [*cmd, "-m", AGENT, script, *plan["args"]]


class Torchrun(Framework):
    name = "torchrun"
    family = "torchrun"
    title = "torchrun (torch.distributed.run)"
    module = "torch"
    extra = "torch"
    warm = False
    engine_hooks = ("jupyter_dist.engine.setup:release_torch_group",)

    _noted: set[int] = set()  # sessions (by id) that were told state does not survive

    def before_layout(self, cluster: Any, spec: RunSpec) -> None:
        """A group an earlier run left on the engines may hold the master port (its store, kept
        open by a DDP model even once the group is released): torchrun's rendezvous, and every
        later run, take a new one, so nothing ever connects to that stale store."""
        if not cluster.node_addrs and spec.master_port is None and port_in_use(cluster.master_port):
            cluster.rotate_master_port()

    def rank_env(self, ctx: RunContext, rank: int) -> dict[str, str]:
        lay = ctx.layout
        env = {
            "NODE_RANK": str(lay.node_of(rank)),
            "MASTER_ADDR": lay.master_addr,
            "MASTER_PORT": str(lay.master_port),
        }
        # torchrun would force 1 thread per worker; it keeps a value it finds in its environment.
        env.update(omp_threads(ctx))
        return env

    def check(self, ctx: RunContext) -> None:
        if ctx.spec.out:
            raise UsageError(
                f"-o {ctx.spec.out} cannot bring variables back from -f torchrun: its workers are new "
                "processes that end with the cell (use -f pytorch for warm ranks)."
            )

    def cell_ranks(self, ctx: RunContext) -> tuple[int, ...]:
        p = ctx.layout.procs_per_node
        return tuple(node * p for node in range(ctx.layout.nodes))

    def cell_code(self, ctx: RunContext, code: str) -> str:
        self._note_once()
        plan = launch_plan(ctx)
        cell = None if plan["script"] is not None else code
        return f"__import__({AGENT!r}, fromlist=['run']).run({plan!r}, {cell!r})"

    def _note_once(self) -> None:
        import jupyter_dist

        key = id(jupyter_dist.get_session())
        if key not in self._noted:
            self._noted.add(key)
            print(NOT_WARM_NOTE, flush=True)
