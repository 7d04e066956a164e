"""A script's `input()` on rank 0, answered in the notebook (engine.script_input is the rank's side).

The run loop hands a rank's request here; the question goes to the user as `input()` in a cell
would ask it (the kernel's own input request, on the notebook's stdin channel), and the line goes
back through the rank's agent. Where the frontend takes no input (`StdinNotImplementedError`), or
the user ends the input, the rank gets EOF, as a script under `mpirun` with no stdin does.
"""

from __future__ import annotations

import builtins
from typing import Any

from jupyter_dist.cluster.agents import RankAgents
from jupyter_dist.common.channel import INPUT_OP, InputAnswer, InputRequest

ANSWER_TIMEOUT_S = 10.0


def ask_user(prompt: str) -> str | None:
    """The line the user typed, or None for end of input (or a frontend that takes none)."""
    try:
        return builtins.input(prompt)
    except EOFError:
        return None
    except Exception as e:  # noqa: BLE001 - ipykernel's StdinNotImplementedError where stdin is not allowed
        if type(e).__name__ == "StdinNotImplementedError":
            return None
        raise


def answer_input(agents: RankAgents, rank: int, request: InputRequest, ask: Any = ask_user) -> str | None:
    """Ask the user `request`'s prompt and send the answer to `rank`; returns why it did not arrive."""
    text = ask(str(request.get("prompt", "")))
    reply = InputAnswer(id=int(request["id"]))
    if text is not None:
        reply["text"] = text
    answers = agents.ask(INPUT_OP, [rank], dict(reply), timeout=ANSWER_TIMEOUT_S)
    if rank in answers.results:
        return None
    return answers.missing.get(rank, "no answer")
