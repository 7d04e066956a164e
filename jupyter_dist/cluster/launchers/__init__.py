"""The launchers by `--launcher` name: the built-in ones, and any a package adds through the
`jupyter_dist.launchers` entry point group (a `Launcher` subclass), as ipyparallel finds its own."""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points

from IPython.core.error import UsageError

from jupyter_dist.cluster.launchers.base import Launcher
from jupyter_dist.cluster.launchers.local import LocalLauncher
from jupyter_dist.cluster.launchers.mpi import MpiLauncher
from jupyter_dist.cluster.launchers.slurm import SlurmLauncher
from jupyter_dist.cluster.launchers.ssh import SshLauncher
from jupyter_dist.cluster.shape import ClusterShape

__all__ = ["Launcher", "launcher_class", "launcher_for", "registry"]

BUILT_IN: dict[str, type[Launcher]] = {
    cls.name: cls for cls in (LocalLauncher, MpiLauncher, SshLauncher, SlurmLauncher)
}


@cache
def registry() -> dict[str, type[Launcher]]:
    """name -> launcher class; an entry point of a built-in's name replaces it."""
    found = dict(BUILT_IN)
    for ep in entry_points(group="jupyter_dist.launchers"):
        found[ep.name] = ep.load()
    return found


def launcher_class(name: str) -> type[Launcher]:
    try:
        return registry()[name]
    except KeyError:
        raise UsageError(f"--launcher {name} is not supported yet.") from None


def launcher_for(shape: ClusterShape) -> Launcher:
    """The launcher of `shape.launcher`, for this shape."""
    return launcher_class(shape.launcher)(shape)
