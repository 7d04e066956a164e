"""Which collective each rank is in, from the agents' answers (pure: the engines' shapes by hand)."""

from __future__ import annotations

from jupyter_dist.run.desync import desync_lines, sizes
from jupyter_dist.run.stacks import rank_words


def rec(op: str, seq: int, shape=(4,), dtype="float32") -> dict:
    return {"op": op, "seq": seq, "group": "default", "start": 0.0, "tensors": [[list(shape), dtype]]}


def answer(flying=None, done=()) -> dict:
    return {"in_flight": [flying] if flying else [], "done": list(done), "now": 0.0}


def test_ranks_read_as_a_person_says_them():
    assert rank_words([1]) == "rank 1"
    assert rank_words([0, 2, 3]) == "ranks 0,2,3"
    assert rank_words([0, 1, 2]) == "ranks 0,1,2"
    assert rank_words(list(range(32))) == "ranks 0-31"
    assert rank_words([0, 1, 2, 3, 5, 8, 9, 10, 11, 12]) == "ranks 0-3,5,8-12"


def test_sizes_read_as_a_person_says_them():
    assert sizes([[[4], "float32"]]) == "4 floats"
    assert sizes([[[2, 3], "float64"]]) == "6 doubles"
    assert sizes([[[4], "float32"]] * 4) == "4 x 4 floats"
    assert sizes([[[1], "int64"]]) == "1 int64"
    assert sizes([]) == "no tensors"


def test_a_mismatched_collective_names_each_side():
    got = {0: answer(rec("all_reduce", 12)), 1: answer(rec("broadcast", 12)),
           2: answer(rec("all_reduce", 12)), 3: answer(rec("all_reduce", 12))}
    assert desync_lines(got) == ["rank 1 is in broadcast #12 (4 floats); ranks 0,2,3 are in all_reduce #12 (4 floats)"]


def test_a_rank_that_never_reached_the_collective_is_the_straggler():
    got = {0: answer(rec("all_reduce", 3), [rec("all_reduce", 2)]), 1: answer(None, [rec("all_reduce", 2)])}
    stacks = {1: [{"main": True, "frames": [["/tmp/ipykernel_1/2.py", 5, "<module>", "time.sleep(60)"]]}]}
    lines = desync_lines(got, stacks, world=[0, 1])
    assert lines[0] == "rank 0 is in all_reduce #3 (4 floats)"
    assert lines[1] == ("rank 1 never reached all_reduce #3 (its last: all_reduce #2 (4 floats)); "
                        "it is at time.sleep at <cell>:5: the straggler")


def test_all_in_the_same_collective_or_none_in_flight():
    same = {r: answer(rec("all_reduce", 7)) for r in range(2)}
    assert desync_lines(same) == []
    assert desync_lines({0: answer(), 1: answer()}) == []
