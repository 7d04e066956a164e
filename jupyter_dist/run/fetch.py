"""`-o NAME`: a variable of each rank's namespace brought back to the notebook, rank by rank."""

from __future__ import annotations

from typing import Any

from jupyter_dist.cluster.engines import EngineCluster
from jupyter_dist.engine.user_vars import fetch_user
from jupyter_dist.errors import OutputFetchError


def fetch_variable(cluster: EngineCluster, name: str, ranks: tuple[int, ...]) -> dict[int, Any]:
    """rank -> value of `name`; one error naming every rank that has none or cannot send it back
    (carrying the values that did come)."""
    client = cluster.client
    eng = cluster.engines
    ars = {r: client[eng[r].engine_id].apply_async(fetch_user, name) for r in ranks}
    values: dict[int, Any] = {}
    problems = []
    for r, a in ars.items():
        try:
            status, value = a.get(30)
        except Exception as e:  # noqa: BLE001 - reported per rank
            status, value = "unsendable", f"{type(e).__name__}: {e}"
        if status == "ok":
            values[r] = value
        elif status == "missing":
            problems.append(f"rank {r} has no variable {name!r}")
        else:
            problems.append(f"rank {r}'s {name!r} cannot be sent back ({value})")
    if problems:
        raise OutputFetchError(f"-o {name}: " + "; ".join(problems) + ".", values)
    return values
