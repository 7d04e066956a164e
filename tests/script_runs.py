"""Running a script twice in warm engines, as the script-mode integration tests do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SHAPE = "-N 1 -n 2 --timeout 200"


def twice(distrun: Any, d: Path, flags: str, script: str, name: str) -> list[list[dict]]:
    """The script run twice with `--out d/name` (it writes name_<rank>.json); each run's results by rank."""
    runs = []
    for _ in range(2):
        distrun(f"{flags} {SHAPE} {d / script} --out {d}/{name}")
        runs.append([json.loads((d / f"{name}_{r}.json").read_text()) for r in range(2)])
    return runs
