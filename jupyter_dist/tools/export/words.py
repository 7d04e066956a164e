"""The run in words, as the generated files' headers say it."""

from __future__ import annotations

from jupyter_dist.plan.spec import RunSpec


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "es" if word.endswith("s") else "s")


def describe(spec: RunSpec) -> str:
    return (f"-f {spec.framework}, {plural(spec.nodes, 'node')} x {plural(spec.procs_per_node, 'process')} "
            f"per node (world size {spec.world_size})")
