"""The autogroup nice a crowded node's ranks' session takes while their output floods the notebook kernel.
Read on both sides: the kernel sets it from its flood watch (cluster/session_weight.py), and a rank that
starts flooding sets it itself, before the starved kernel can tell (engine/flood_signal.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping

SWITCH = "JUPYTER_DIST_FLOOD_NICE"
FLOOD_NICE = 9  # weight 110 of a nice-0 session's 1024


def flood_nice(environ: Mapping[str, str] = os.environ) -> int:
    """SWITCH's value (0-19; 0 turns the change off), else FLOOD_NICE."""
    value = environ.get(SWITCH, "").strip()
    try:
        return max(0, min(19, int(value))) if value else FLOOD_NICE
    except ValueError:
        return FLOOD_NICE
