"""Script mode on a rank: run a file as `__main__` with `$RANK`-style arguments expanded.

Also what every torchrun worker runs its script through (engine/frameworks/torchrun_agent.py).
"""

from __future__ import annotations

import os
import re
import runpy
import sys

RANK_VARS = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def expand_rank_vars(arg: str, env: dict[str, str] | os._Environ[str] | None = None) -> str:
    """`$RANK`, `${LOCAL_RANK}`, ... from this rank's environment; anything else untouched."""
    env = os.environ if env is None else env
    for name in RANK_VARS:  # longest names first, so $RANK does not eat $RANK_X
        value = env.get(name)
        if value is None:
            continue
        arg = arg.replace("${" + name + "}", value)
        arg = re.sub(r"\$" + name + r"(?![A-Za-z0-9_])", value, arg)
    return arg


def run_script(path: str, args: list[str]) -> None:
    """Run `path` as `__main__` with this rank's expanded arguments."""
    argv = [path, *(expand_rank_vars(a) for a in args)]
    old_argv = sys.argv
    sys.argv = argv
    script_dir = os.path.dirname(path)
    sys.path.insert(0, script_dir)
    try:
        runpy.run_path(path, run_name="__main__")
    finally:
        sys.argv = old_argv
        if sys.path and sys.path[0] == script_dir:
            sys.path.pop(0)
