"""The notebook's run as an export needs it: the framework's family, the layout (through the
one plan, with the ports an exported job uses) and what the framework set on each rank.

Only the framework's own variables are kept, not the fabric's: network settings belong to the
cluster the script runs on, not to this host.
"""

from __future__ import annotations

import json

from IPython.core.error import UsageError

from jupyter_dist import frameworks
from jupyter_dist.plan.layout import Layout
from jupyter_dist.plan.plan import TORCHRUN_MASTER_PORT, Ports, layout_of
from jupyter_dist.plan.spec import RunSpec

TF_BASE_PORT = 2222  # task r listens on TF_BASE_PORT + r
# Variables the prelude derives from the launcher, or that belong to one launcher or host: never
# baked into the script as constants.
LAYOUT_KEYS = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK",
    "LOCAL_WORLD_SIZE", "GROUP_RANK", "OMP_NUM_THREADS", "TF_CONFIG",
})
LAYOUT_PREFIXES = ("OMPI_", "PMI_", "MPI_", "SLURM_", "AZ_", "HOROVOD_", "TORCHELASTIC_", "JUPYTER_DIST_")


def family_of(framework: str) -> str:
    """The framework's family (torch, torchrun, mpi, tensorflow), from the registry."""
    return frameworks.get(framework).family


def default_format(spec: RunSpec) -> str:
    """The launcher that fits the run when --format is not given."""
    if spec.launcher == "slurm":
        return "sbatch"
    return "torchrun" if family_of(spec.framework) in ("torch", "torchrun") else "mpirun"


def export_ports(spec: RunSpec) -> Ports:
    """An exported job's ports: --master-port or torchrun's 29500; TensorFlow task r on 2222 + r."""
    master = spec.master_port or TORCHRUN_MASTER_PORT
    return Ports(master, tuple(TF_BASE_PORT + r for r in range(spec.world_size)))


def export_layout(spec: RunSpec) -> Layout:
    return layout_of(spec, export_ports(spec))


def framework_envs(spec: RunSpec) -> list[dict[str, str]] | None:
    """Every rank's framework environment for the layout, or None when the framework is not here."""
    try:
        fw = frameworks.get(spec.framework)
    except UsageError:
        return None
    backend = spec.backend if spec.backend != "auto" else "gloo"
    ctx = frameworks.RunContext(spec, export_layout(spec), backend)
    return [fw.rank_env(ctx, r) for r in range(spec.world_size)]


def framework_constants(envs: list[dict[str, str]] | None) -> dict[str, str]:
    """Framework variables with one value on every rank that are not layout or launcher variables
    (DS_ACCELERATOR and the like): the script sets them as defaults."""
    if not envs:
        return {}
    first = envs[0]
    return {
        k: v for k, v in sorted(first.items())
        if k not in LAYOUT_KEYS and not k.startswith(LAYOUT_PREFIXES) and all(e.get(k) == v for e in envs)
    }


def tf_roles(spec: RunSpec, envs: list[dict[str, str]] | None) -> list[list[object]]:
    """(task type, index) per rank: the framework module's TF_CONFIG, else workers then `--ps` servers."""
    if envs and all("TF_CONFIG" in e for e in envs):
        tasks = [json.loads(e["TF_CONFIG"])["task"] for e in envs]
        return [[t["type"], int(t["index"])] for t in tasks]
    workers = spec.world_size - spec.ps
    return [["worker", r] for r in range(workers)] + [["ps", i] for i in range(spec.ps)]
