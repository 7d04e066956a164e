"""`%dist export --format torchrun`: a bash file that starts torchrun on one node; run it on
every node with its node rank. torchrun starts fresh workers, so only torch families fit."""

from __future__ import annotations

import shlex

from IPython.core.error import UsageError

from jupyter_dist.plan.spec import RunSpec
from jupyter_dist.tools.export.options import launcher_name
from jupyter_dist.tools.export.shell import script_args, shell_default
from jupyter_dist.tools.export.words import describe


def check_family(spec: RunSpec, family: str) -> None:
    """torchrun gives neither MPI nor TF_CONFIG: refuse the families that need them."""
    if family == "mpi":
        raise UsageError(f"%dist export: -f {spec.framework} needs an MPI launcher, and torchrun is none: "
                         "use --format mpirun, sbatch or azureml.")
    if family == "tensorflow":
        raise UsageError("%dist export: -f tensorflow reads TF_CONFIG, which torchrun does not give: "
                         "use --format mpirun, sbatch or azureml.")


def torchrun_text(spec: RunSpec, script: str, master_addr: str, master_port: int) -> tuple[str, str]:
    n, p = spec.nodes, spec.procs_per_node
    name = shlex.quote(script)
    body = f"""#!/usr/bin/env bash
# jupyter-dist export (torchrun): {describe(spec)}.
# Start it on every node at about the same time, each with its node rank (0..{n - 1}) and node 0's address:
#   NODE_RANK=0 MASTER_ADDR=<address of node 0> bash {shlex.quote(launcher_name(script, 'torchrun'))}
# torchrun starts {p} new worker processes per node, each with RANK, LOCAL_RANK, WORLD_SIZE, ...;
# nothing from the notebook's warm ranks carries over. PYTHON picks the interpreter.
# Arguments after the file name go to the script.
set -euo pipefail
cd "$(dirname "$0")"
NODE_RANK="${{NODE_RANK:-0}}"
{shell_default("MASTER_ADDR", master_addr)}
{shell_default("MASTER_PORT", master_port)}
# python -m torch.distributed.run is torchrun
exec "${{PYTHON:-python}}" -m torch.distributed.run --nnodes {n} --nproc_per_node {p} \\
  --node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \\
  {name} {script_args(spec)}
"""
    shown = " ".join([f"torchrun --nnodes {n} --nproc_per_node {p} --node_rank $NODE_RANK",
                      f"--master_addr {master_addr} --master_port {master_port} {name}",
                      *[shlex.quote(a) for a in spec.script_args]])
    return body, shown
