"""The command line a node's torchrun agent starts: `python -m torch.distributed.run ...`.

Its own module (no engine state) so that the agent and tests can build it alike.
"""

from __future__ import annotations

from typing import Any

AGENT = "jupyter_dist.engine.frameworks.torchrun_agent"  # run as `-m`: the wrapper of every worker
CELL_SCRIPT = "distrun_cell.py"  # the cell as the script torchrun runs (its frames read as the cell's)
ROLE = "default"  # torchrun's role name: its tee prefix is "[default<local rank>]:"


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
