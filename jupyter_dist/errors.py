"""The exceptions a run raises in the notebook. Each renders as its own short report
(IPython's `_render_traceback_`), not as a traceback through jupyter-dist's internals."""

from __future__ import annotations


class DistRunError(Exception):
    """A run that failed on the ranks; `report` holds the lines the notebook shows."""

    def __init__(self, summary: str, report: list[str] | None = None) -> None:
        super().__init__(summary)
        self.summary = summary
        self.report = report or []

    def _render_traceback_(self) -> list[str]:
        return [*self.report, f"{type(self).__name__}: {self.summary}"]


class RankFailure(DistRunError):
    """One or more ranks raised or died."""

    def __init__(self, summary: str, report: list[str], failed: list[int]) -> None:
        super().__init__(summary, report)
        self.failed = failed


class RunTimeout(DistRunError):
    """The run outlasted `--timeout`."""


class OutputFetchError(DistRunError):
    """`-o NAME` could not be brought back from some ranks; `values` holds the others'."""

    def __init__(self, summary: str, values: dict[int, object] | None = None) -> None:
        super().__init__(summary)
        self.values = values or {}
