"""`%dist export`: the last `%%distrun` cell as a script, plus the file that launches it outside
the notebook (torchrun, mpirun, sbatch or an Azure ML v2 command job).

Pure: `build` turns a `RunSpec` and the cell into texts; only `write` touches the disk.

The script does not import jupyter-dist. A small generated prelude (`prelude`) reads what the
launcher gave and sets the variables the cell saw in the notebook, per framework family:
torch.distributed's `env://` variables, Open MPI's and Azure ML's MPI variables, or TensorFlow's
`TF_CONFIG`. One module per target format writes its launcher file; `script` writes the script.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

from jupyter_dist.plan.spec import RunSpec
from jupyter_dist.tools.export import torchrun
from jupyter_dist.tools.export.azureml import SCHEMA, azureml_text
from jupyter_dist.tools.export.mpirun import mpirun_text
from jupyter_dist.tools.export.options import (
    DEFAULT_SCRIPT,
    FORMATS,
    ExportOptions,
    check_file,
    launcher_name,
    parse_options,
)
from jupyter_dist.tools.export.run_env import (
    LAYOUT_KEYS,
    default_format,
    export_layout,
    family_of,
    framework_constants,
    tf_roles,
)
from jupyter_dist.tools.export.run_env import (
    framework_envs as _framework_envs,  # `build` looks it up here, so a test can replace it
)
from jupyter_dist.tools.export.sbatch import sbatch_text
from jupyter_dist.tools.export.script import script_text

__all__ = [
    "DEFAULT_SCRIPT", "FORMATS", "LAYOUT_KEYS", "SCHEMA", "Export", "ExportOptions", "ExportedFile", "build",
    "framework_constants", "parse_options", "tf_roles", "write",
]


@dataclass(frozen=True)
class ExportedFile:
    path: str
    text: str
    executable: bool = False


@dataclass(frozen=True)
class Export:
    format: str
    script: ExportedFile
    launcher: ExportedFile
    run: tuple[str, ...]  # how to run it, one line each
    notes: tuple[str, ...] = ()

    def summary(self) -> str:
        lines = [f"jupyter-dist: wrote {self.script.path} and {self.launcher.path}", *self.run]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def build(spec: RunSpec, code: str | None, options: ExportOptions) -> Export:
    """The script and the launcher file for `options.format`, without writing anything."""
    fmt = options.format or default_format(spec)
    family = family_of(spec.framework)
    if fmt == "torchrun":
        torchrun.check_family(spec, family)
    directory, name = check_file(options.file)
    layout = export_layout(spec)
    envs = _framework_envs(spec)
    text, notes = script_text(spec, code, directory or ".", family=family, layout=layout, envs=envs)
    port = layout.master_port
    launcher_path = os.path.join(directory, launcher_name(name, fmt))
    shown_launcher = shlex.quote(launcher_path)
    cd = f"cd {shlex.quote(directory)} && " if directory else ""
    if fmt == "torchrun":
        body, shown = torchrun.torchrun_text(spec, name, layout.master_addr, port)
        run = (f"run on every node n = 0..{spec.nodes - 1}: NODE_RANK=n MASTER_ADDR=<address of node 0> bash {shown_launcher}",
               f"which runs: {shown}")
    elif fmt == "mpirun":
        body, shown = mpirun_text(spec, name, family, layout.master_addr, port, layout.hosts, layout.all_local)
        run = (f"run on node 0: bash {shown_launcher}", f"which runs: {shown}")
    elif fmt == "sbatch":
        body = sbatch_text(spec, name, family, port)
        run = (f"submit: {cd}sbatch {shlex.quote(launcher_name(name, fmt))}",)
    else:
        body = azureml_text(spec, name, family, options.compute, options.environment)
        run = (f"submit: az ml job create --file {shown_launcher} --resource-group <group> --workspace-name <workspace>",)
    if spec.out:
        run += (f"each rank saves -o {spec.out} to {spec.out}.rank<RANK>.pkl in the script's folder "
                "(JUPYTER_DIST_OUT_DIR to change it)",)
    return Export(
        format=fmt,
        script=ExportedFile(os.path.join(directory, name), text),
        launcher=ExportedFile(launcher_path, body, executable=fmt != "azureml"),
        run=run,
        notes=tuple(notes),
    )


def write(exp: Export) -> list[str]:
    """Write both files (launchers executable); returns their paths."""
    paths = []
    for f in (exp.script, exp.launcher):
        with open(f.path, "w") as fh:
            fh.write(f.text)
        if f.executable:
            os.chmod(f.path, 0o755)
        paths.append(f.path)
    return paths
