"""`input()` and `sys.stdin` in rank 0's `--fresh` child (engine.script_fresh), as in a warm script:
each line is asked of the notebook. The child cannot reach the notebook itself, so it asks its
engine: it writes `INPUT_LINE_PREFIX` + the prompt (JSON) as a line on stderr, and reads the answer
as one line on its stdin (a pipe); the engine asks the notebook (engine.script_input) and writes the
answer, or closes the pipe at end of input. The other ranks' children have `/dev/null` (EOF), as
under `mpirun`."""

from __future__ import annotations

import builtins
import json
import os
import sys
from typing import Any

from jupyter_dist.common.channel import INPUT_LINE_PREFIX
from jupyter_dist.engine.line_stdin import LineStdin

RELAY_VAR = "JUPYTER_DIST_STDIN_RELAY"  # "1" in rank 0's child: ask the engine for each line


def ask_engine(prompt: Any = "") -> str:
    """`input()` in the child: the line the engine writes back (EOFError when it closes the pipe)."""
    with_newline = _ask(prompt)
    if not with_newline:
        raise EOFError("EOF when reading a line")
    return with_newline[:-1] if with_newline.endswith("\n") else with_newline


def _ask(prompt: Any) -> str:
    sys.stdout.flush()  # what the script printed before the question comes first
    sys.__stderr__.write(INPUT_LINE_PREFIX + json.dumps(str(prompt)) + "\n")
    sys.__stderr__.flush()
    return sys.__stdin__.readline()


def install_in_child() -> None:
    """In rank 0's child: `input` and `sys.stdin` ask the engine."""
    if os.environ.get(RELAY_VAR) == "1":
        builtins.input = ask_engine
        sys.stdin = LineStdin(ask_engine)


def prompt_of(line: str) -> str | None:
    """The prompt a child's stderr line asks with; None for any other line."""
    if not line.startswith(INPUT_LINE_PREFIX):
        return None
    try:
        return str(json.loads(line[len(INPUT_LINE_PREFIX):]))
    except ValueError:
        return None
