"""When a node is crowded: more ranks than RANKS_PER_CORE a core. Read on both sides: the kernel
starts a crowded node's fork server in a session of its own (cluster/zygote.py), and each engine of a
crowded node stays in that session instead of taking one of its own (engine/sessions.py)."""

from __future__ import annotations

RANKS_PER_CORE = 2  # beyond this many ranks a core a node is crowded


def crowded(ranks: int, cores: int) -> bool:
    """Whether `ranks` on a node of `cores` cores are more than RANKS_PER_CORE a core."""
    return ranks > RANKS_PER_CORE * max(cores, 1)
