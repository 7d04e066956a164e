"""A `sys.stdin` whose every line is asked of someone (the notebook, or the engine of a `--fresh`
child): `readline()`, `for line in sys.stdin` and `read()` work; an empty answer ends the stream
(a notebook's input box has no Ctrl-D), as does `EOFError` from the asker."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any


class LineStdin(io.TextIOBase):
    """`sys.stdin` of rank 0: each line read is `ask("")`; its end of input ends the stream."""

    def __init__(self, ask: Callable[[Any], str]) -> None:
        super().__init__()
        self._ask = ask
        self._ended = False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def readable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def readline(self, size: int | None = -1) -> str:  # noqa: ARG002 - a line is what the asker gives
        if self._ended:
            return ""
        try:
            text = self._ask("")
        except EOFError:
            text = ""
        if not text:  # no Ctrl-D in a notebook's input box: an empty answer ends the stream
            self._ended = True
            return ""
        return text + "\n"

    def read(self, size: int | None = -1) -> str:
        lines: list[str] = []
        while size is None or size < 0 or sum(map(len, lines)) < size:
            line = self.readline()
            if not line:
                break
            lines.append(line)
        return "".join(lines)
