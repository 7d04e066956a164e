"""Which collective each rank is in, said for a person: the mismatch a hang really is, the straggler.

Pure: it reads what the ranks' agents answered for "collectives" (engine/collectives.py: per rank
the collectives in flight and the last completed ones, numbered per process group from the cell's
start) and, where given, their stacks (engine/stacks.py). `%dist stacks`, the sidebar and the
`--timeout` report show its lines:

    rank 1 is in broadcast #12 (4 floats); ranks 0,2,3 are in all_reduce #12 (4 floats)
    rank 2 never reached all_reduce #12 (its last: all_reduce #11); it is at time.sleep at <cell>:5
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jupyter_dist.run.stacks import group, rank_words

Record = Mapping[str, Any]  # {"op", "seq", "group", "start", "tensors": [[shape, dtype], ...]}
DTYPE_WORDS = {"float32": "float", "float64": "double", "float16": "half", "bfloat16": "bfloat16",
               "int64": "int64", "int32": "int32", "uint8": "byte", "int8": "int8", "bool": "bool"}


def sizes(tensors: Sequence[Sequence[Any]]) -> str:
    """'4 floats', '4 x 1024 floats' (a list of tensors alike), '3 tensors' when they differ."""
    if not tensors:
        return "no tensors"
    shapes = {(tuple(shape), str(dtype)) for shape, dtype in tensors}
    if len(shapes) > 1:
        return f"{len(tensors)} tensors"
    shape, dtype = shapes.pop()
    numel = 1
    for dim in shape:
        numel *= int(dim)
    word = DTYPE_WORDS.get(dtype, dtype)
    plural = word if numel == 1 or word.endswith(("16", "32", "64", "int8")) else f"{word}s"
    one = f"{numel} {plural}"
    return f"{len(tensors)} x {one}" if len(tensors) > 1 else one


def describe(record: Record) -> str:
    """'all_reduce #12 (4 floats)'."""
    return f"{record['op']} #{record['seq']} ({sizes(record.get('tensors') or [])})"


def in_flight(answer: Record | None) -> Record | None:
    """The rank's oldest collective still in flight: the one it waits in."""
    flying = (answer or {}).get("in_flight") or []
    return flying[0] if flying else None


def last_done(answer: Record | None, group_key: str) -> Record | None:
    done = [r for r in (answer or {}).get("done") or [] if r.get("group") == group_key]
    return done[-1] if done else None


def desync_lines(collectives: Mapping[int, Record], stacks: Mapping[int, Any] | None = None,
                 world: Sequence[int] | None = None) -> list[str]:
    """What each rank is in, when ranks are not all in the same collective; [] when nothing is in flight.

    `collectives`: rank -> the agent's answer; `stacks`: rank -> its threads (for where a straggler
    is); `world`: every rank of the run (a rank that did not answer is named as such)."""
    ranks = sorted(set(world or ()) | set(collectives))
    current = {r: in_flight(collectives.get(r)) for r in ranks if r in collectives}
    waiting = {r: rec for r, rec in current.items() if rec is not None}
    if not waiting:
        return []
    by_what: dict[tuple[Any, ...], list[int]] = {}
    shown: dict[tuple[Any, ...], Record] = {}
    for r, rec in sorted(waiting.items()):
        key = (rec.get("group"), rec["seq"], rec["op"], sizes(rec.get("tensors") or []))
        by_what.setdefault(key, []).append(r)
        shown.setdefault(key, rec)
    parts = sorted(by_what.items(), key=lambda kv: (len(kv[1]), kv[1]))  # the odd one out first
    lines = []
    if len(parts) > 1 or len(waiting) < len(ranks):
        lines.append("; ".join(f"{rank_words(rs)} {'is' if len(rs) == 1 else 'are'} in {describe(shown[k])}"
                               for k, rs in parts))
    # the collective most ranks wait in: ranks not in it and behind it never reached it
    target = shown[max(by_what, key=lambda k: (len(by_what[k]), k[1]))]
    where = {g_rank: g.where for g in group({r: stacks[r] for r in stacks}) for g_rank in g.ranks} if stacks else {}
    for r in ranks:
        if r not in collectives:
            lines.append(f"rank {r} did not answer: its collectives are unknown")
            continue
        rec = current.get(r)
        if rec is not None and (rec.get("group"), rec["seq"]) >= (target.get("group"), target["seq"]):
            continue
        if rec is not None and rec.get("group") != target.get("group"):
            continue
        last = last_done(collectives[r], str(target.get("group")))
        behind = f"its last: {describe(last)}" if last else "it made none before"
        at = f"; it is at {where[r]}" if r in where else ""
        if rec is None:
            lines.append(f"rank {r} never reached {target['op']} #{target['seq']} ({behind}){at}: the straggler")
        else:
            lines.append(f"rank {r} is behind, in {describe(rec)} while others are in #{target['seq']}{at}")
    return lines


def records_by_rank(answers: Mapping[int, Any]) -> dict[int, Record]:
    """Each rank's record, its worker's in place of its engine's: an engine that waits on workers
    (--fresh's child, torchrun's workers) answers with theirs under "workers", each with its "rank"
    (None: the answering engine's own; engine/collectives.py). A worker's record wins over the engine
    of the same rank (torchrun: rank 1's engine is idle while node 0's engine runs its worker); a
    worker that did not answer leaves its rank out (said as not answering)."""
    own: dict[int, Record] = {}
    from_workers: dict[int, Record | None] = {}
    for rank, answer in answers.items():
        if not isinstance(answer, Mapping):
            continue
        own[rank] = {k: v for k, v in answer.items() if k != "workers"}
        for worker in answer.get("workers") or ():
            r = rank if worker.get("rank") is None else int(worker["rank"])
            from_workers[r] = None if "error" in worker else worker
    merged = {**own, **from_workers}
    return {r: rec for r, rec in merged.items() if rec is not None}
