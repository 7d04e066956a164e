"""The exported script: a docstring, the prelude with the run's constants baked in, the cell (or
the script-mode runner), then what the run did after the cell (`-o`, torch's clean exit).

The script is the same for every format, so exporting several formats side by side never
leaves them out of step.
"""

from __future__ import annotations

import os

from jupyter_dist.plan.layout import Layout
from jupyter_dist.plan.spec import RunSpec
from jupyter_dist.tools.export.cell import cell_source, free_names
from jupyter_dist.tools.export.prelude import (
    FAMILY_PRELUDE,
    PRELUDE_COMMON,
    PRELUDE_DEFAULTS,
    PRELUDE_MPI_INIT,
    PRELUDE_PLACE,
    SAVE_OUT,
    SCRIPT_MODE,
    SHELL_SHIM,
    TORCH_END,
)
from jupyter_dist.tools.export.run_env import TF_BASE_PORT, framework_constants, tf_roles
from jupyter_dist.tools.export.words import describe


def script_text(spec: RunSpec, code: str | None, script_dir: str, *, family: str, layout: Layout,
                envs: list[dict[str, str]] | None) -> tuple[str, list[str]]:
    """The exported script and notes about it. `code` is the cell (None: script mode);
    `envs` the framework's variables per rank (None when the framework is not here)."""
    notes: list[str] = []
    constants = framework_constants(envs)
    if constants:
        shown = ", ".join(f"{k}={v}" for k, v in constants.items())
        notes.append(f"the script sets {shown} by default, as -f {spec.framework} did on this host; "
                     "change it in the script where the cluster differs (GPUs, say).")
    baked: dict[str, object] = {
        "nodes": spec.nodes,
        "procs_per_node": spec.procs_per_node,
        "hosts": list(layout.hosts),
        "master_addr": layout.master_addr,
        "master_port": layout.master_port,
        "env": {**constants, **spec.user_env},
    }
    if family == "tensorflow":
        baked["tf_roles"] = tf_roles(spec, envs)
        baked["tf_port"] = TF_BASE_PORT

    if code is not None:
        source, shell_used = cell_source(code)
        missing = free_names(source)
        if missing:
            notes.append(
                f"the cell uses {', '.join(missing)}, which it does not define (earlier cells did, on the warm "
                "ranks): add their definitions to the script, or it stops with a NameError."
            )
        what = "the %%distrun cell"
    else:
        assert spec.script is not None
        baked["script"] = relative_script(spec.script, script_dir)
        if os.path.isabs(str(baked["script"])):
            notes.append(f"the script {spec.script} is outside {os.path.abspath(script_dir)}: copy it beside "
                         "the export for launchers that upload a folder (Azure ML's code: .).")
        shell_used = False
        source = SCRIPT_MODE
        what = f"%distrun {os.path.basename(spec.script)} (script mode)"

    parts = [
        "#!/usr/bin/env python3\n",
        f'"""Exported by jupyter-dist (%dist export) from {what}: {describe(spec)}.\n\n'
        "Run it with the launcher file written beside it, or under torchrun, mpirun, srun or an Azure ML job:\n"
        "the prelude turns what the launcher gives into the environment the cell saw in the notebook.\n"
        "Network settings (NCCL_SOCKET_IFNAME, NCCL_IB_*, UCX_*) are the cluster's: set them in its environment.\n"
        '"""\n',
        PRELUDE_COMMON,
        f"\n_JD = {baked!r}\n",
        PRELUDE_MPI_INIT if family == "mpi" else PRELUDE_PLACE,
        PRELUDE_DEFAULTS,
        FAMILY_PRELUDE[family],
        SHELL_SHIM if shell_used else "",
        "\n# ---- end of the prelude ----\n\n",
        source.rstrip("\n") + "\n",
    ]
    if spec.out:
        parts.append(SAVE_OUT.format(name=spec.out, lookup="globals()" if code is not None else "_jd_globals"))
    if family in ("torch", "torchrun"):
        parts.append(TORCH_END)
    text = "".join(parts)
    compile(text, "<exported script>", "exec")  # a bug here must not become a file
    return text, notes


def relative_script(script: str, script_dir: str) -> str:
    """A script-mode file as the export finds it: relative to the export's folder, else absolute."""
    path = os.path.abspath(script)
    base = os.path.abspath(script_dir)
    rel = os.path.relpath(path, base)
    return path if rel.startswith(os.pardir) else rel
