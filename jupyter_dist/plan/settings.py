"""The settings a user may tune, in one place, each with its help (traitlets, as nbclient does).

In a notebook: `%config DistSettings.start_timeout = 300`, or in `ipython_config.py`
(`c.DistSettings.start_timeout = 300`). Each default also reads an environment variable, named in
its help, when the settings are first made (not at import): a CI job or a launcher script can set
it without touching the notebook.
"""

from __future__ import annotations

import os
from pathlib import Path

from traitlets import Bool, Float, Int, Unicode, default
from traitlets.config import Configurable


def _env_bool(name: str, fallback: bool) -> bool:
    """1/true/yes/on or 0/false/no/off (any case); anything else, or unset, is `fallback`."""
    value = os.environ.get(name, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    return fallback


def _env_float(name: str, fallback: float) -> float:
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return fallback


class DistSettings(Configurable):
    """jupyter-dist's tunable settings (`%config DistSettings` lists them)."""

    state_dir = Unicode(help="Folder for the cluster's state, per-rank logs and stacks "
                             "(default $JUPYTER_DIST_DIR, else ~/.jupyter_dist).").tag(config=True)
    start_timeout = Float(help="Seconds the engines may take to start before the start is given up "
                               "(default $JUPYTER_DIST_START_TIMEOUT, else 180).").tag(config=True)
    fail_grace = Float(help="Seconds the other ranks get to finish or fail after the first rank failed "
                            "(default $JUPYTER_DIST_FAIL_GRACE, else 3).").tag(config=True)
    interrupt_grace = Float(help="Seconds a rank gets to stop after an interrupt before its engine is given up "
                                 "(default $JUPYTER_DIST_INTERRUPT_GRACE, else 5).").tag(config=True)
    death_grace = Float(help="Seconds the other ranks get to finish or fail after the first rank's engine died "
                             "(it cannot take part any more: the others are stopped and the death reported "
                             "sooner than after an exception; default $JUPYTER_DIST_DEATH_GRACE, else 0.3)."
                        ).tag(config=True)
    spare_engines = Int(help="Engines kept started beside the ranks, given no rank, so that a dead rank's place "
                             "is taken at once (the next cell does not wait for a new engine to start); each "
                             "imports what the ranks imported among torch.distributed, numpy, tensorflow, ... "
                             "Only with --launcher mpi or local on this host "
                             "(default $JUPYTER_DIST_SPARE_ENGINES, else 1; 0: a new engine starts at a death)."
                        ).tag(config=True)
    output_wait = Float(help="Seconds to wait for the ranks' last output once the cell ended "
                             "(default $JUPYTER_DIST_OUTPUT_WAIT, else 60).").tag(config=True)
    keep_folders = Int(help="How many per-run log folders, and how many cluster profile folders, to keep under "
                            "state_dir; older ones are removed, never the current run's nor a live kernel's "
                            "(default $JUPYTER_DIST_KEEP_FOLDERS, else 50; 0 keeps all).").tag(config=True)
    background_start = Bool(help="Start the engines in the background when the extension loads (`%load_ext "
                                 "jupyter_dist`), with the panel's layout (its defaults), on this host only "
                                 "(--launcher mpi or local); the first cell then waits only for what is left. "
                                 "Off by default: loading the extension starts no process "
                                 "(default $JUPYTER_DIST_BACKGROUND_START, else 0).").tag(config=True)

    fork_engines = Bool(help="With --launcher mpi and every rank on this host, fork the engines from one process "
                             "per node that imported the engine stack (and torch, for a torch framework) once; "
                             "mpiexec starts a small stub per rank, the ranks stay one MPI world. "
                             "On by default: 32 engines start in about 0.7x the time of ipyparallel's MPI cluster, "
                             "and a first torch cell waits for no torch import per rank (benchmarks/README.md); "
                             "0 starts every engine as its own `python -m ipyparallel.engine` "
                             "(default $JUPYTER_DIST_FORK_ENGINES, else 1; 0: off)."
                        ).tag(config=True)

    @default("state_dir")
    def _state_dir(self) -> str:
        return os.environ.get("JUPYTER_DIST_DIR") or str(Path.home() / ".jupyter_dist")

    @default("start_timeout")
    def _start_timeout(self) -> float:
        return _env_float("JUPYTER_DIST_START_TIMEOUT", 180.0)

    @default("fail_grace")
    def _fail_grace(self) -> float:
        return _env_float("JUPYTER_DIST_FAIL_GRACE", 3.0)

    @default("interrupt_grace")
    def _interrupt_grace(self) -> float:
        return _env_float("JUPYTER_DIST_INTERRUPT_GRACE", 5.0)

    @default("death_grace")
    def _death_grace(self) -> float:
        return _env_float("JUPYTER_DIST_DEATH_GRACE", 0.3)

    @default("spare_engines")
    def _spare_engines(self) -> int:
        return max(0, int(_env_float("JUPYTER_DIST_SPARE_ENGINES", 1)))

    @default("background_start")
    def _background_start(self) -> bool:
        return _env_bool("JUPYTER_DIST_BACKGROUND_START", False)

    @default("fork_engines")
    def _fork_engines(self) -> bool:
        return _env_bool("JUPYTER_DIST_FORK_ENGINES", True)

    @default("keep_folders")
    def _keep_folders(self) -> int:
        return int(_env_float("JUPYTER_DIST_KEEP_FOLDERS", 50))

    @default("output_wait")
    def _output_wait(self) -> float:
        return _env_float("JUPYTER_DIST_OUTPUT_WAIT", 60.0)


_settings: DistSettings | None = None


def settings() -> DistSettings:
    """This process's settings (made on first use; `load_ipython_extension` registers the same object
    with the shell so that `%config` reaches it)."""
    global _settings
    if _settings is None:
        _settings = DistSettings()
    return _settings
