"""`input()` in a script, in a real kernel: rank 0 asks the notebook (the kernel's stdin channel, as
`input()` in a cell does), the other ranks get EOF, as under `mpirun`."""

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


def test_input_on_rank_0_asks_the_notebook(tmp_path):
    script = tmp_path / "asks.py"
    script.write_text(ASKS)
    with started_kernel() as (_km, kc):
        wait_idle(kc, kc.execute("%load_ext jupyter_dist")).raise_error()
        msg_id = kc.execute(f"%distrun -f pytorch -N 1 -n 2 --timeout 120 {script}", allow_stdin=True)
        prompts = answer_stdin(kc, ["12", "yes"])
        out = wait_idle(kc, msg_id).raise_error().stdout
        wait_idle(kc, kc.execute("%dist stop"))
    assert prompts == ["How many intervals? ", "Again? "]
    assert "[rank 0] rank 0 read 12" in out and "[rank 0] rank 0 then read 'yes'" in out
    assert "[rank 1] rank 1 read None" in out and "[rank 1] rank 1 then read 'EOF'" in out
