"""What a rank sends the notebook besides its output, typed: one module read on both sides.

Data rides on a display message of type `DATA_MIME` (`{"key": ..., "data": ...}`): it arrives in
order with the rank's output and costs no round trip; the notebook routes it by key. Lines of
output can carry two marks as well: `RELABEL` (the line is another rank's: a torchrun agent on a
node leader attributes its workers' lines so) and `METRICS_LINE_PREFIX` (a metrics batch printed
where no kernel carries display messages, as in a torchrun worker).
"""

from __future__ import annotations

from typing import Any, Final, TypedDict

DATA_MIME: Final = "application/vnd.jupyter-dist.data+json"

# keys of the data messages
METRICS: Final = "metrics"  # a batch of `report()` records (MetricsBatch)
EXIT: Final = "exit"  # the rank is about to `os._exit` (ExitData)
GROUP_GONE: Final = "torch_group_gone"  # the cell destroyed the torch process group it had made (True)
INPUT: Final = "input"  # a script's input() on rank 0 waits for the notebook's answer (InputRequest)

INPUT_OP: Final = "input"  # the agent's operation that hands the answer back (InputAnswer)

RELABEL: Final = "\x1e"  # RELABEL + "<rank>" + RELABEL + line: the line is that rank's
METRICS_LINE_PREFIX: Final = "\x1fjupyter-dist-metrics "  # + the MetricsBatch as JSON
INPUT_LINE_PREFIX: Final = "\x1fjupyter-dist-input "  # + the prompt as JSON: a --fresh child asks for a line


class Message(TypedDict):
    """What a `DATA_MIME` display carries."""

    key: str
    data: Any


class ExitData(TypedDict):
    code: int


class InputRequest(TypedDict):
    id: int  # the answer names it: one input() at a time, but a late answer must not feed the next
    prompt: str


class InputAnswer(TypedDict, total=False):
    id: int
    text: str  # the line typed, without its newline; absent: end of input (EOFError)


class MetricsBatch(TypedDict, total=False):
    """Columns of the records since the last batch; `t` and each column are aligned."""

    v: int  # format version: 1
    t: list[float]
    step: list[int | None]
    samples: list[float | None]
    tokens: list[float | None]
    scalars: dict[str, list[float | None]]
    auto_t: list[float]  # times of optimizer steps, when the cell called no report()


def message(key: str, data: Any) -> Message:
    return {"key": key, "data": data}


def message_in(content: dict[str, Any]) -> Message | None:
    """The data message in a display's content, or None if the display is the user's."""
    return content.get("data", {}).get(DATA_MIME)


def relabel(rank: int, line: str) -> str:
    """`line` marked as `rank`'s."""
    return f"{RELABEL}{rank}{RELABEL}{line}"
