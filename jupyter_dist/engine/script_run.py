"""Script mode on a rank, with a launcher's contract (`%distrun script.py`).

Under `torchrun` or `mpiexec` a script is a process: `sys.exit(0)` (or `None`, `False`, as
`unittest.main()` ends) is success, another code is the process's exit status, `input()` reads
the launcher's stdin on rank 0 and gets EOF elsewhere, and a second run starts from nothing. In a
warm engine the script runs as `__main__` of the engine's process, so this module keeps that
contract: `SystemExit` becomes the rank's exit status (`ScriptExit`, which the notebook reports as
such, without a traceback or IPython's exit warning), `input()` asks the notebook
(engine.script_input), and before each run what a fresh process would not have is reset
(engine.script_reset), its `atexit` handlers run as it ends (engine.script_atexit), and where a warm
re-run cannot be made clean one line says why (engine.script_note). `--fresh` runs the script in a new child process instead (engine.script_fresh).
"""

from __future__ import annotations

import sys
from typing import Any

from jupyter_dist.engine import script_atexit, script_fresh, script_input, script_note, script_reset
from jupyter_dist.engine.script import run_script


class ScriptExit(Exception):  # noqa: N818 - named as what it is: the script's exit, not an error of ours
    """The script ended with a non-zero exit status (`sys.exit(3)`), as a launcher would report it."""

    def __init__(self, status: int) -> None:
        super().__init__(f"exit status {status}")
        self.status = status


def exit_status(code: Any) -> int:
    """The status a process would exit with for `sys.exit(code)`; a message is printed to stderr
    and gives 1, as Python's own exit does."""
    if code is None or code is False:
        return 0
    if isinstance(code, int):
        return int(code) & 0xFF  # sys.exit(-1) ends a process with 255
    print(code, file=sys.stderr, flush=True)
    return 1


def run(path: str, args: list[str], fresh: bool = False) -> None:
    """Run the script on this rank; a non-zero exit status raises `ScriptExit`."""
    status = script_fresh.run(path, args) if fresh else run_warm(path, args)
    if status:
        raise ScriptExit(status)


def run_warm(path: str, args: list[str]) -> int:
    """The script as `__main__` of this engine, after the resets a fresh process needs no more."""
    status = 0
    with script_reset.fresh_state(path), script_note.noted(script_reset.last_dropped()), \
            script_input.asking_notebook(), script_atexit.at_script_end(script_reset.script_roots(path)):
        try:
            run_script(path, args)
        except SystemExit as e:
            status = exit_status(e.code)
    return status
