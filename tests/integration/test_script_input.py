"""`input()` and `sys.stdin` in a script and in a `%%distrun` cell, in a real kernel: rank 0 asks the
notebook (the kernel's stdin channel, as `input()` in a cell does), the other ranks get EOF, as under
`mpirun`. One kernel and one cluster for the module."""

from __future__ import annotations

import textwrap

import pytest
from kernel import started_kernel, wait_idle

pytestmark = [pytest.mark.engines, pytest.mark.timeout(240)]

ASKS = textwrap.dedent(
    """
    import os

    rank = os.environ["RANK"]
    print(f"rank {rank} starts", flush=True)
    try:
        n = int(input("How many intervals? "))
    except EOFError:
        n = None
    print(f"rank {rank} read {n}", flush=True)
    try:
        again = input("Again? ")
    except EOFError:
        again = "EOF"
    print(f"rank {rank} then read {again!r}", flush=True)
    """
)


def answer_stdin(kc, answers: list[str | None], timeout: float = 120) -> list[str]:
    """Answer the kernel's input requests in order (None: end the input, as Ctrl-D); their prompts."""
    prompts = []
    for text in answers:
        msg = kc.get_stdin_msg(timeout=timeout)
        assert msg["msg_type"] == "input_request"
        prompts.append(msg["content"]["prompt"])
        kc.input(text if text is not None else "")
    return prompts


CELL = textwrap.dedent(
    """
    import os, sys
    rank = os.environ["RANK"]
    try:
        name = input("Your name? ")
    except EOFError:
        name = None
    first = sys.stdin.readline()
    rest = [line.strip() for line in sys.stdin]
    print(f"rank {rank} name={name!r} first={first!r} rest={rest!r}", flush=True)
    """
)

FLAGS = "-f pytorch -N 1 -n 2 --timeout 120"


@pytest.fixture(scope="module")
def kc():
    with started_kernel() as (_km, client):
        wait_idle(client, client.execute("%load_ext jupyter_dist")).raise_error()
        yield client
        wait_idle(client, client.execute("%dist stop"))


def test_input_on_rank_0_asks_the_notebook(kc, tmp_path):
    script = tmp_path / "asks.py"
    script.write_text(ASKS)
    msg_id = kc.execute(f"%distrun {FLAGS} {script}", allow_stdin=True)
    prompts = answer_stdin(kc, ["12", "yes"])
    out = wait_idle(kc, msg_id).raise_error().stdout
    assert prompts == ["How many intervals? ", "Again? "]
    assert "[rank 0] rank 0 read 12" in out and "[rank 0] rank 0 then read 'yes'" in out
    assert "[rank 1] rank 1 read None" in out and "[rank 1] rank 1 then read 'EOF'" in out


def test_input_and_stdin_in_a_cell(kc):
    """input(), sys.stdin.readline() and `for line in sys.stdin` (up to an empty answer) in a cell."""
    msg_id = kc.execute(f"%%distrun {FLAGS}\n{CELL}", allow_stdin=True)
    prompts = answer_stdin(kc, ["Ada", "one", "two", "three", ""])  # an empty answer ends sys.stdin
    out = wait_idle(kc, msg_id).raise_error().stdout
    assert prompts == ["Your name? ", "", "", "", ""]
    assert "[rank 0] rank 0 name='Ada' first='one\\n' rest=['two', 'three']" in out, out
    assert "[rank 1] rank 1 name=None first='' rest=[]" in out, out


def test_input_in_a_fresh_child_asks_the_notebook_too(kc, tmp_path):
    """--fresh: rank 0's child asks through its engine (engine.stdin_relay); rank 1's child reads EOF."""
    script = tmp_path / "asks_fresh.py"
    script.write_text(ASKS + "import sys\nprint('rank', rank, 'lines', [l.strip() for l in sys.stdin], flush=True)\n")
    msg_id = kc.execute(f"%distrun {FLAGS} --fresh {script}", allow_stdin=True)
    prompts = answer_stdin(kc, ["7", "no", "a", "b", ""])
    out = wait_idle(kc, msg_id).raise_error().stdout
    assert prompts == ["How many intervals? ", "Again? ", "", "", ""]
    assert "[rank 0] rank 0 read 7" in out and "[rank 0] rank 0 then read 'no'" in out, out
    assert "[rank 0] rank 0 lines ['a', 'b']" in out, out
    assert "rank 1 read None" in out and "[rank 1] rank 1 lines []" in out, out  # its prompt shows, as under mpirun
