"""Running a script twice in warm engines, as the script-mode integration tests do."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jupyter_dist
from jupyter_dist.run.output import TextSink

SHAPE = "-N 1 -n 2 --timeout 200"


def twice(distrun: Any, d: Path, flags: str, script: str, name: str) -> list[list[dict]]:
    """The script run twice with `--out d/name` (it writes name_<rank>.json); each run's results by rank."""
    runs = []
    for _ in range(2):
        distrun(f"{flags} {SHAPE} {d / script} --out {d}/{name}")
        runs.append([json.loads((d / f"{name}_{r}.json").read_text()) for r in range(2)])
    return runs


@contextlib.contextmanager
def recorded_sinks() -> Iterator[list[TextSink]]:
    """The sinks of the runs made inside (their metrics: the counted steps), in order."""
    made: list[TextSink] = []
    runner = jupyter_dist.get_session().runner
    old = runner.sink_factory

    def factory() -> TextSink:
        made.append(TextSink())
        return made[-1]

    runner.sink_factory = factory
    try:
        yield made
    finally:
        runner.sink_factory = old
