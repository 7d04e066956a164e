"""A rank's crash record where the kernel cannot read the node's files: served by the node's live ranks.

faulthandler writes a dying rank's stacks to its crash file on the node's disk. The kernel reads it
there when the state folder is shared; when it is not (no shared home, a node-local folder), the
dead rank's agent is gone with it, so another rank's agent on that node reads the file and answers
(op `crash`). Where the kernel's state folder cannot be made or written on a node, the stack and
crash files go to a node-local folder of the same name under the temp folder, the same for every
rank of the node.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from jupyter_dist.common.files import read_crash
from jupyter_dist.engine import agent

_armed: dict[str, str] = {}  # the folder this engine's stack and crash files are in


def usable_folder(stack_dir: str) -> str:
    """`stack_dir` if this node can write there, else `<tmp>/jupyter-dist-<uid>/<profile>/stacks`."""
    try:
        os.makedirs(stack_dir, mode=0o700, exist_ok=True)
        if os.access(stack_dir, os.W_OK | os.X_OK):
            _armed["dir"] = stack_dir
            return stack_dir
    except OSError:
        pass
    profile = os.path.basename(os.path.dirname(os.path.abspath(stack_dir)))
    local = os.path.join(tempfile.gettempdir(), f"jupyter-dist-{os.getuid()}", profile, "stacks")
    os.makedirs(local, mode=0o700, exist_ok=True)
    _armed["dir"] = local
    return local


def crash_records(args: dict[str, Any] | None = None) -> dict[str, str]:
    """{rank: what faulthandler wrote} for `args["ranks"]`, read from this node's stack folder."""
    folder = _armed.get("dir")
    ranks = (args or {}).get("ranks") or []
    if folder is None:
        return {}
    return {str(int(r)): read_crash(folder, int(r)) for r in ranks}


def register() -> None:
    agent.register("crash", crash_records)
