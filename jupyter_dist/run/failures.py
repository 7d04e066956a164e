"""Failures as data: a record per rank that failed, the first by time named, and the report.

As torch elastic's `ChildFailedError` does, a run that fails names the rank that failed first
(by the time the kernel saw it) and shows what the others were doing. The runner collects the
records (and what the rank, its crash file or the launcher said about a dead engine); these pure
functions order them and word the error the notebook shows.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from jupyter_dist.errors import RankFailure, RunTimeout
from jupyter_dist.plan.layout import RankPlace

# exception: the cell raised; exit: the rank ended its process with a code (os._exit);
# death: its engine process ended with no word (a signal, the OOM killer, a crash);
# timeout: still running when --timeout passed; status: a script ended with a non-zero exit
# status (sys.exit(3)) in an engine that lives on (engine.script_run.ScriptExit)
What = Literal["exception", "exit", "death", "timeout", "status"]
SCRIPT_EXIT = "ScriptExit"  # the name of engine.script_run's exception, as ipyparallel hands it back

NO_EXIT_CODE = "its engine process ended with no exit code: a signal such as SIGKILL, or the OOM killer"
OTHERS_SHOWN = 8  # lines of the traceback shown for each rank that failed after the first
CRASH_PREFIX = "Fatal Python error: "
DEATH_LINE = ("--- the next run replaces the dead rank's engine (its variables are lost) and the other ranks keep "
              "theirs; where it cannot (another host, a launcher that ended every rank), it restarts the cluster")


@dataclass(frozen=True)
class Failure:
    """One rank's failure."""

    place: RankPlace
    what: What
    when: float  # time.monotonic() when the kernel saw it: orders the failures
    error: str = ""  # "ValueError: boom": what was raised, in one line
    traceback: tuple[str, ...] = ()  # the rendered traceback (exception), the Python stack (timeout)
    exit_code: int | None = None  # the code the rank gave os._exit (exit)
    note: str | None = None  # how its process ended, as the rank, its crash file or the launcher told

    @property
    def rank(self) -> int:
        return self.place.rank

    @property
    def died(self) -> bool:
        return self.what in ("exit", "death")

    @property
    def where(self) -> str:
        p = self.place
        return f"rank {p.rank} (node {p.node}, local rank {p.local_rank})"


# -- the errors ipyparallel hands back ------------------------------------------------------

def is_engine_death(err: Any) -> bool:
    """ipyparallel's `EngineError`: the engine process went away while it ran the cell."""
    return getattr(err, "ename", None) == "EngineError" or type(err).__name__ == "EngineError"


def error_name(err: Any) -> str:
    ename = getattr(err, "ename", None) or type(err).__name__
    evalue = getattr(err, "evalue", None) or str(err)
    return f"{ename}: {evalue}"


def script_status(err: Any) -> int | None:
    """The exit status of a script that ended with `sys.exit(status)`, else None."""
    if getattr(err, "ename", None) != SCRIPT_EXIT and type(err).__name__ != SCRIPT_EXIT:
        return None
    m = re.fullmatch(r"exit status (-?\d+)", str(getattr(err, "evalue", None) or err).strip())
    return int(m.group(1)) if m else None


def render_error(err: Any) -> list[str]:
    """A rank's traceback as IPython renders it (a `RemoteError`), else its one-line name."""
    render = getattr(err, "render_traceback", None)
    if render is not None:
        with contextlib.suppress(Exception):
            return list(render())
    return [error_name(err)]


# -- records ------------------------------------------------------------------------------

def from_error(place: RankPlace, err: Any, when: float, exit_code: int | None = None) -> Failure:
    """The record of a rank whose cell ended with `err` (raised, or its engine's death)."""
    if is_engine_death(err):
        return Failure(place, "death" if exit_code is None else "exit", when, error_name(err), exit_code=exit_code)
    status = script_status(err)
    if status is not None:
        return Failure(place, "status", when, f"exit status {status}", exit_code=status)
    return Failure(place, "exception", when, error_name(err), tuple(render_error(err)))


def stalled(place: RankPlace, when: float, stack: str) -> Failure:
    """A rank still running at the deadline, with its Python stack."""
    return Failure(place, "timeout", when, traceback=tuple(stack.splitlines()))


def local_notes(failures: Iterable[Failure], crashes: Mapping[int, str]) -> dict[int, str]:
    """How dead ranks ended, from what this side knows: the exit code a rank announced, else the
    first line faulthandler wrote to its crash file (`crashes`, by rank)."""
    notes: dict[int, str] = {}
    for f in failures:
        if not f.died:
            continue
        if f.exit_code is not None:
            notes[f.rank] = f"exited with code {f.exit_code}"
        elif crash := crashes.get(f.rank, "").strip():
            notes[f.rank] = f"crashed: {crash.splitlines()[0].removeprefix(CRASH_PREFIX)}"
    return notes


def with_notes(failures: Iterable[Failure], notes: Mapping[int, str]) -> list[Failure]:
    """The records with the launcher's (or the ranks') notes on how their processes ended."""
    return [replace(f, note=notes[f.rank]) if f.rank in notes else f for f in failures]


def with_crash_stacks(failures: Iterable[Failure], crashes: Mapping[int, str]) -> list[Failure]:
    """Dead ranks with what faulthandler wrote (their stacks when the fatal signal came) as their traceback."""
    return [replace(f, traceback=tuple(crashes[f.rank].strip().splitlines()))
            if f.died and not f.traceback and crashes.get(f.rank, "").strip() else f for f in failures]


def in_order(failures: Iterable[Failure]) -> list[Failure]:
    """The first failure, then the others by time.

    The first is the earliest; but when that is an engine death, the earliest rank with a note
    on how it ended comes first: mpiexec ends the whole job when one rank dies, and the rank it
    names is the one that died, the others were stopped with it."""
    ordered = sorted(failures, key=lambda f: f.when)
    if not ordered:
        return []
    first = ordered[0]
    if first.died:
        first = next((f for f in ordered if f.note), first)
    return [first, *(f for f in ordered if f is not first)]


# -- what the notebook shows --------------------------------------------------------------

def report_lines(order: list[Failure], finished: Iterable[int]) -> list[str]:
    """The error's report: the first failure in full, what each other rank was doing, who finished."""
    first = order[0]
    lines: list[str] = []
    for f in order:
        if f is first:
            lines.append(f"--- {f.where} failed first:")
            if f.died:
                lines.append(f"its engine process {f.note or 'ended with no exit code'}")
                lines.extend(f.traceback)  # its crash file's stacks, where it had one
            elif f.what == "status":
                lines.append(f"its script exited with status {f.exit_code}")
            else:
                lines.extend(f.traceback)
        elif f.what == "status":  # its own exit, not a wait on the first
            lines.append(f"--- {f.where}: its script exited with status {f.exit_code}")
        elif f.died:
            lines.append(f"--- {f.where}: its engine was stopped too (mpiexec ends the whole job when one rank dies)")
        else:
            lines.append(f"--- {f.where} failed after it (was it waiting for rank {first.rank}?):")
            lines.extend(f.traceback[-OTHERS_SHOWN:])
    done = list(finished)
    if done:
        lines.append("--- finished normally: rank " + ", ".join(str(r) for r in done))
    if any(f.died for f in order):
        lines.append(DEATH_LINE)
    return lines


def summary(order: list[Failure]) -> str:
    """'rank 2 failed first (ValueError: bad shard); failed ranks: 2, 0'."""
    first = order[0]
    if first.what == "status":
        return _status_summary(order)
    cause = first.note or (NO_EXIT_CODE if first.died else first.error)
    verb = "died" if first.died else "failed first"
    return f"rank {first.rank} {verb} ({cause}); failed ranks: " + ", ".join(str(f.rank) for f in order)


def _status_summary(order: list[Failure]) -> str:
    """'ranks 0, 1 exited with status 3; failed ranks: 1, 0': the first rank's status, every rank that
    exited with it, then the failed ranks by time (as a launcher reports a process's exit)."""
    first = order[0]
    same = sorted(f.rank for f in order if f.what == "status" and f.exit_code == first.exit_code)
    who = f"rank {first.rank}" if len(same) == 1 else "ranks " + ", ".join(str(r) for r in same)
    return f"{who} exited with status {first.exit_code}; failed ranks: " + ", ".join(str(f.rank) for f in order)


def rank_failure(failures: Iterable[Failure], finished: Iterable[int]) -> RankFailure:
    """The error a run with failed ranks raises; `finished`: the ranks that ended normally."""
    order = in_order(failures)
    if not order:
        raise ValueError("a rank failure needs at least one failed rank")
    return RankFailure(summary(order), report_lines(order, finished), [f.rank for f in order])


def run_timeout(timeout: float, pending: Iterable[Failure]) -> RunTimeout:
    """The error a run that outlasted --timeout raises, with each running rank's stack."""
    stalled_ranks = list(pending)
    lines: list[str] = []
    for f in stalled_ranks:
        lines.append(f"--- rank {f.rank} was still running; its Python stack:")
        lines.extend(f.traceback)
    ranks = ", ".join(str(f.rank) for f in stalled_ranks)
    return RunTimeout(f"the run passed --timeout {timeout:g} s; still running: rank(s) {ranks}", lines)


def timeout_report(timeout: float, running: Iterable[int], stack_lines: Iterable[str],
                   stuck: Iterable[int] = (), stopping: Iterable[int] = ()) -> RunTimeout:
    """The error of a run past --timeout: who was still running, every rank's stack (grouped, from the
    agents; native where Python did not answer), which ranks could not be stopped, and which were still
    stopping when this was reported (cluster/stopping.py)."""
    ranks = ", ".join(str(r) for r in running)
    lines = ["--- the ranks' stacks at the deadline:", *stack_lines]
    stuck, stopping = list(stuck), list(stopping)
    if stuck:
        lines.append("--- rank(s) " + ", ".join(str(r) for r in stuck) + " did not stop: their engines were killed and "
                     "the next run replaces them (their variables are lost); the other ranks keep theirs")
    if stopping:
        lines.append("--- rank(s) " + ", ".join(str(r) for r in stopping) + " had not stopped yet (an MPI call or "
                     "native code does not return to Python): those still running interrupt_grace after the release "
                     "are killed and replaced before the next run (their variables are lost); the others keep theirs")
    if not stuck and not stopping:
        lines.append("--- every rank stopped and keeps its variables; a torch process group the hang left "
                     "broken was destroyed: the next init_process_group makes a fresh one")
    return RunTimeout(f"the run passed --timeout {timeout:g} s; still running: rank(s) {ranks}", lines)
