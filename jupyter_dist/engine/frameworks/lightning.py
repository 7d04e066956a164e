"""Engine side of PyTorch Lightning: wrap the Trainer (and Lightning's MPI environment) on import.

Under `%%distrun` the wrapped `Trainer.__init__` takes the run's environment (`NODE_RANK`,
`LOCAL_RANK`, `WORLD_SIZE`: not Slurm's or MPI's guess), does not refuse the notebook as
"interactive", and fails with one sentence when its `devices`/`num_nodes` are not the run's
layout. Lightning's MPI environment (picked whenever mpi4py sees a world, as under `-f mpi`)
takes its node from the run's `NODE_RANK` instead of the host name, so virtual nodes on one host
work too. Nothing here imports Lightning until the cell does.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from jupyter_dist.engine.frameworks.patch import when_imported

# the unified package and the standalone one, each with its fabric
PACKAGES = (("lightning.pytorch", "lightning.fabric"), ("pytorch_lightning", "lightning_fabric"))


class LayoutMismatch(ValueError):
    """The Trainer's devices x num_nodes is not the run's layout."""


def run_layout() -> tuple[int, int] | None:
    """(nodes, procs per node) of the current run, from its environment; None outside a run."""
    fw = os.environ.get("JUPYTER_DIST_FRAMEWORK")
    env = os.environ
    if fw == "lightning":
        world, local = env.get("WORLD_SIZE"), env.get("LOCAL_WORLD_SIZE")
    elif fw == "mpi":
        world, local = env.get("OMPI_COMM_WORLD_SIZE"), env.get("OMPI_COMM_WORLD_LOCAL_SIZE")
    else:
        return None
    if not (world and local and world.isdigit() and local.isdigit()) or int(local) == 0:
        return None
    return int(world) // int(local), int(local)


def layout_problem(devices: int, num_nodes: int, layout: tuple[int, int]) -> str | None:
    nodes, procs = layout
    if (devices, num_nodes) == (procs, nodes):
        return None
    return (
        f"Trainer(devices={devices}, num_nodes={num_nodes}) does not match this run's layout "
        f"(-N {nodes} -n {procs}): pass Trainer(devices={procs}, num_nodes={nodes}) or change the %%distrun flags."
    )


def patch_lightning() -> None:
    """Engine hook: patch Lightning's Trainer and MPI environment when (or if) they are imported."""
    for pkg, fabric in PACKAGES:
        when_imported(f"{pkg}.trainer.trainer", _patch_trainer)
        when_imported(f"{fabric}.plugins.environments.mpi", _patch_mpi_environment)


def _patch_trainer(module: ModuleType) -> None:
    trainer_cls = module.Trainer
    if getattr(trainer_cls.__init__, "_jupyter_dist", False):
        return
    original = trainer_cls.__init__
    pkg = module.__name__.rsplit(".trainer.trainer", 1)[0]

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        layout = run_layout()
        if layout is None:
            original(self, *args, **kwargs)
            return
        if os.environ.get("JUPYTER_DIST_FRAMEWORK") == "lightning":
            kwargs["plugins"] = _with_run_environment(pkg, kwargs.get("plugins"), kwargs.get("strategy"))
        with _not_interactive(pkg):
            original(self, *args, **kwargs)
        problem = layout_problem(self.num_devices, self.num_nodes, layout)
        if problem:
            raise LayoutMismatch(problem)
        launcher = getattr(self.strategy, "launcher", None)
        if launcher is not None and not _external(launcher):
            raise ValueError(
                f"Trainer(strategy={kwargs.get('strategy')!r}) starts processes of its own, but under %%distrun "
                "every rank already is one: use strategy='ddp'."
            )

    __init__._jupyter_dist = True  # type: ignore[attr-defined]
    trainer_cls.__init__ = __init__


def _external(launcher: Any) -> bool:
    """Lightning's script launcher starts nothing when the cluster environment launched the processes."""
    env = getattr(launcher, "cluster_environment", None)
    return type(launcher).__name__ == "_SubprocessScriptLauncher" and bool(getattr(env, "creates_processes_externally", False))


def _with_run_environment(pkg: str, plugins: Any, strategy: Any) -> list[Any]:
    """The user's plugins, plus the run's cluster environment unless they chose one."""
    import importlib

    envs = importlib.import_module(f"{pkg}.plugins.environments")
    items = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    if any(isinstance(p, envs.ClusterEnvironment) for p in items) or getattr(strategy, "cluster_environment", None):
        return items
    return [*items, _run_environment_class(envs)()]


@functools.cache
def _run_environment_class(envs: ModuleType) -> type:
    class RunEnvironment(envs.LightningEnvironment):  # type: ignore[name-defined,misc]
        """LightningEnvironment that leaves the run's WORLD_SIZE in place at teardown (the run owns it)."""

        def teardown(self) -> None:
            pass

    return RunEnvironment


@contextlib.contextmanager
def _not_interactive(pkg: str) -> Iterator[None]:
    """The engines are not where processes would be forked from: Lightning's notebook checks do not apply."""
    import importlib

    mod = importlib.import_module(f"{pkg}.trainer.connectors.accelerator_connector")
    old = getattr(mod, "_IS_INTERACTIVE", False)
    mod._IS_INTERACTIVE = False
    try:
        yield
    finally:
        mod._IS_INTERACTIVE = old


def _patch_mpi_environment(module: ModuleType) -> None:
    env_cls = module.MPIEnvironment
    if getattr(env_cls._init_comm_local, "_jupyter_dist", False):
        return
    original = env_cls._init_comm_local

    @functools.wraps(original)
    def _init_comm_local(self: Any) -> None:
        node = os.environ.get("NODE_RANK", "")
        if not (os.environ.get("JUPYTER_DIST_FRAMEWORK") and node.isdigit()):
            original(self)
            return
        self._node_rank = int(node)
        self._comm_local = self._comm_world.Split(color=self._node_rank)

    _init_comm_local._jupyter_dist = True  # type: ignore[attr-defined]
    env_cls._init_comm_local = _init_comm_local
