"""What new rank engines import in the background while they start (`engine/preload.py`).

The modules follow the framework's family: a torch framework's set-up imports torch.distributed on
every rank (`torch_idempotent_init`), which cost 3.4 s of a cold 4-rank first cell on 2 cores when
it began only after every engine had registered and been mapped (benchmarks/README.md).
"""

from __future__ import annotations

from typing import Any

# a family -> what its set-up imports on every rank anyway (nothing more: no import a run would not do)
BY_FAMILY: dict[str, tuple[str, ...]] = {"torch": ("torch.distributed",)}
# ipyparallel's config sections of the launchers whose engine arguments reach the engine unquoted
ENGINE_SETS = {"mpi": "MPIEngineSetLauncher", "local": "LocalEngineSetLauncher"}


def modules_for(family: str) -> tuple[str, ...]:
    return BY_FAMILY.get(family, ())


def startup_command(modules: tuple[str, ...]) -> str:
    """The engine's startup command: the import thread started, no name left in the user's namespace."""
    return ("from jupyter_dist.engine.preload import start as _jd_preload; "
            f"_jd_preload({list(modules)!r}); del _jd_preload")


def configure(cluster: Any, launcher: str, remote: bool, modules: tuple[str, ...]) -> bool:
    """Add the startup command to an unstarted `ipyparallel.Cluster`'s engine arguments (engines
    on this host, started by mpiexec or locally); True when it was added."""
    section = ENGINE_SETS.get(launcher)
    if not modules or section is None or remote:
        return False
    conf = getattr(cluster.config, section)
    args = list(conf.engine_args) if "engine_args" in conf else []
    conf.engine_args = [*args, f"--IPEngine.startup_command={startup_command(modules)}"]
    return True
