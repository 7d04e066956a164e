"""Children in a process group of their own: the kernel's launchers and a node's torchrun use it."""

from __future__ import annotations

import os
import sys
from typing import Any


def own_group() -> dict[str, Any]:
    """`subprocess.Popen` arguments for a child in a process group of its own, in this session."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}
