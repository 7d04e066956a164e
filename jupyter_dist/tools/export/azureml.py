"""`%dist export --format azureml`: an Azure ML v2 command job (YAML), with the small writer that
emits it (no PyYAML needed)."""

from __future__ import annotations

import json
import re
import shlex

from jupyter_dist.plan.spec import RunSpec
from jupyter_dist.tools.export.options import launcher_name
from jupyter_dist.tools.export.words import describe, plural

SCHEMA = "https://azuremlschemas.azureedge.net/latest/commandJob.schema.json"
AZURE_ENVIRONMENTS = {  # curated environments; replace with yours (--environment)
    "torch": "azureml:AzureML-acpt-pytorch-2.2-cuda12.1@latest",
    "mpi": "azureml:AzureML-acpt-pytorch-2.2-cuda12.1@latest",
    "tensorflow": "azureml:AzureML-tensorflow-2.12-cuda11@latest",
}


def azureml_data(spec: RunSpec, script: str, family: str, compute: str | None, environment: str | None) -> dict[str, object]:
    """The Azure ML v2 command job as a mapping (emitted as YAML by `to_yaml`)."""
    command = " ".join(["python", shlex.quote(script), *(shlex.quote(a) for a in spec.script_args)])
    if family == "tensorflow":
        distribution: dict[str, object] = {"type": "tensorflow", "worker_count": spec.world_size - spec.ps,
                                           "parameter_server_count": spec.ps}
    else:
        distribution = {"type": "mpi" if family == "mpi" else "pytorch",
                        "process_count_per_instance": spec.procs_per_node}
    default_compute = "azureml:gpu-cluster" if spec.backend == "nccl" else "azureml:cpu-cluster"
    return {
        "$schema": SCHEMA,
        "type": "command",
        "display_name": script[:-3],
        "experiment_name": "jupyter-dist",
        "code": ".",
        "command": command,
        "environment": _azure_ref(environment) or AZURE_ENVIRONMENTS[family if family != "torchrun" else "torch"],
        "compute": _azure_ref(compute) or default_compute,
        "resources": {"instance_count": spec.nodes},
        "distribution": distribution,
    }


def _azure_ref(value: str | None) -> str | None:
    if value is None:
        return None
    return value if value.startswith("azureml:") or value == "local" else f"azureml:{value}"


PLAIN = re.compile(r"[A-Za-z$.][A-Za-z0-9_./:@+ $-]*\Z")
YAML_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"})


def _yaml_scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    plain = (PLAIN.match(text) and ": " not in text and " #" not in text and text.lower() not in YAML_WORDS
             and not _numeric(text))
    return text if plain and not text.endswith(" ") else json.dumps(text)


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return text.lower() in (".inf", ".nan", "-.inf")
    return True


def to_yaml(data: dict[str, object], indent: int = 0) -> str:
    """Block-style YAML for nested mappings of strings and numbers (no PyYAML needed)."""
    pad = " " * indent
    out = []
    for key, value in data.items():
        if isinstance(value, dict):
            out.append(f"{pad}{key}:\n{to_yaml(value, indent + 2)}")
        else:
            out.append(f"{pad}{key}: {_yaml_scalar(value)}\n")
    return "".join(out)


def azureml_text(spec: RunSpec, script: str, family: str, compute: str | None, environment: str | None) -> str:
    data = azureml_data(spec, script, family, compute, environment)
    placeholders = [flag for flag, given in (("--compute", compute), ("--environment", environment)) if given is None]
    lines = [
        f"# jupyter-dist export (Azure ML v2 command job): {describe(spec)}.",
        f"# Submit: az ml job create --file {launcher_name(script, 'azureml')} --resource-group <group> --workspace-name <workspace>",
    ]
    if placeholders:
        fields = " and ".join(flag[2:] for flag in placeholders)
        lines.append(f"# {' and '.join(placeholders)} not given to %dist export: the {fields} below "
                     f"{'are examples' if len(placeholders) > 1 else 'is an example'}; name yours.")
    if family == "tensorflow":
        lines.append("# Azure ML sets TF_CONFIG for each task; the script uses it as it is.")
    else:
        lines.append(f"# Azure ML starts {plural(spec.procs_per_node, 'process')} on each of "
                     f"{plural(spec.nodes, 'instance')} and sets their rank variables.")
    return "\n".join(lines) + "\n" + to_yaml(data)

