"""`%dist export --format sbatch`: a Slurm batch file whose launch step fits the framework family
(one torchrun per node, Open MPI's mpirun, or one srun task per rank)."""

from __future__ import annotations

import shlex

from IPython.core.error import UsageError

from jupyter_dist.plan import validate
from jupyter_dist.plan.spec import RunSpec
from jupyter_dist.tools.export.options import launcher_name
from jupyter_dist.tools.export.shell import script_args, shell_default
from jupyter_dist.tools.export.words import describe


def sbatch_text(spec: RunSpec, script: str, family: str, master_port: int) -> str:
    n, p, w = spec.nodes, spec.procs_per_node, spec.world_size
    name = shlex.quote(script)
    stem = script[:-3]
    header = [f"#SBATCH --job-name={stem}", f"#SBATCH --nodes={n}", f"#SBATCH --ntasks-per-node={p}"]
    for key, value in spec.slurm:
        try:
            validate.slurm_option(key, value)
        except validate.InvalidValue as e:
            raise UsageError(f"%dist export: {e}.") from None
        header.append(f"#SBATCH --{key}={value}")
    header.append(f"#SBATCH --output={stem}-%j.out")
    if family == "torchrun":
        launch = (f'srun --nodes={n} --ntasks-per-node=1 --kill-on-bad-exit=1 \\\n'
                  f'  "${{PYTHON:-python}}" -m torch.distributed.run --nnodes {n} --nproc_per_node {p} \\\n'
                  f'  --rdzv_id "$SLURM_JOB_ID" --rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" \\\n'
                  f'  {name} {script_args(spec)}')
        how = "one torchrun per node (srun), which starts the node's workers"
    elif family == "mpi":
        launch = (f'"${{MPIRUN:-mpirun}}" -np {w} -x MASTER_ADDR -x MASTER_PORT -x JUPYTER_DIST_PROCS_PER_NODE \\\n'
                  f'  "${{PYTHON:-python}}" {name} {script_args(spec)}')
        how = "Open MPI's mpirun, which reads the Slurm allocation (or: srun --mpi=pmix with a Slurm-aware MPI)"
    else:
        launch = (f'srun --nodes={n} --ntasks-per-node={p} --kill-on-bad-exit=1 \\\n'
                  f'  "${{PYTHON:-python}}" {name} {script_args(spec)}')
        how = "srun, one task per rank; the script maps SLURM_PROCID and friends to the rank's variables"
    return f"""#!/bin/bash
{chr(10).join(header)}
# jupyter-dist export (sbatch): {describe(spec)}.
# Submit it from the folder that holds {name}: sbatch {shlex.quote(launcher_name(script, 'sbatch'))}
# Launch: {how}.
set -euo pipefail
cd "${{SLURM_SUBMIT_DIR:-.}}"
mapfile -t JD_NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
# node 0 at the address Slurm itself reaches it (a node name need not resolve on the nodes)
JD_ADDR="$(scontrol show node "${{JD_NODES[0]}}" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2 || true)"
export MASTER_ADDR="${{JD_ADDR:-${{JD_NODES[0]}}}}"
{shell_default("MASTER_PORT", master_port, export=True)}
JUPYTER_DIST_HOSTS="$(IFS=,; echo "${{JD_NODES[*]}}")"
export JUPYTER_DIST_HOSTS
export JUPYTER_DIST_PROCS_PER_NODE={p}
{launch}
"""
