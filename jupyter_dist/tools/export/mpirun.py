"""`%dist export --format mpirun`: a bash file that starts every rank with Open MPI's mpirun,
run once on node 0."""

from __future__ import annotations

import shlex

from jupyter_dist.plan.spec import RunSpec
from jupyter_dist.tools.export.options import launcher_name
from jupyter_dist.tools.export.shell import script_args, shell_default
from jupyter_dist.tools.export.words import describe


def master_exports(spec: RunSpec, master_addr: str, master_port: int) -> str:
    p = spec.procs_per_node
    return "\n".join([
        shell_default("MASTER_ADDR", master_addr, export=True),
        shell_default("MASTER_PORT", master_port, export=True),
        f"export JUPYTER_DIST_PROCS_PER_NODE={p}  # the notebook's layout: local rank = rank % {p}, node = rank // {p}",
    ])


def mpirun_text(spec: RunSpec, script: str, family: str, master_addr: str, master_port: int,
                hosts: tuple[str, ...], all_local: bool) -> tuple[str, str]:
    p, w = spec.procs_per_node, spec.world_size
    name = shlex.quote(script)
    host_arg = "" if all_local else " --host " + shlex.quote(",".join(f"{h}:{p}" for h in hosts))
    xs = ["MASTER_ADDR", "MASTER_PORT", "JUPYTER_DIST_PROCS_PER_NODE"]
    extra = ""
    if family == "tensorflow":
        xs.append("JUPYTER_DIST_HOSTS")
        extra = "# TF_CONFIG: one host per node\n" + shell_default("JUPYTER_DIST_HOSTS", ",".join(hosts), export=True) + "\n"
    xflags = " ".join(f"-x {x}" for x in xs)
    if all_local and spec.nodes > 1:
        extra = (f"# The notebook's {spec.nodes} nodes were this host; on a cluster add --host node0:{p},node1:{p},... "
                 "(or --hostfile) and set MASTER_ADDR to node 0.\n") + extra
    body = f"""#!/usr/bin/env bash
# jupyter-dist export (mpirun): {describe(spec)}.
# Run it once, on node 0: bash {shlex.quote(launcher_name(script, 'mpirun'))}
# As root, Open MPI needs: export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# More ranks than cores needs: export PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe (or --oversubscribe)
# MPIRUN and PYTHON pick the launcher and the interpreter. Arguments after the file name go to the script.
set -euo pipefail
cd "$(dirname "$0")"
{master_exports(spec, master_addr, master_port)}
{extra}exec "${{MPIRUN:-mpirun}}" -np {w}{host_arg} {xflags} \\
  "${{PYTHON:-python}}" {name} {script_args(spec)}
"""
    shown = f"mpirun -np {w}{host_arg} {xflags} python {name}"
    if spec.script_args:
        shown += " " + " ".join(shlex.quote(a) for a in spec.script_args)
    return body, shown
