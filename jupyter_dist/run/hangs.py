"""A run past `--timeout` (or interrupted): every rank's stack first, then every rank released.

Nothing here waits on a rank's main thread, which is the thread the cell holds: the stacks and the
release go to each rank's agent (a thread of its own, engine/agent.py), and where the agent cannot
answer (the main thread holds the GIL in native code) the native stack comes from py-spy, which
reads the process from outside. A rank that does not stop is the runner's to replace. The report does
not wait for every rank to stop: after REPORT_WAIT_S, the ranks whose agents answered but which are still
running are watched for the rest of `interrupt_grace` by cluster/stopping.py (kept if they stop, killed and
replaced before the next run if not).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_dist.cluster import stopping
from jupyter_dist.cluster.agents import Answers
from jupyter_dist.cluster.engines import EngineCluster
from jupyter_dist.common.hosts import is_local_host
from jupyter_dist.plan.settings import settings
from jupyter_dist.run import failures, stacks
from jupyter_dist.run.desync import desync_lines, records_by_rank

ASK_S = 1.0  # how long a rank's agent gets to answer; one that does not holds the GIL in native code
INTERRUPT_ASK_S = 0.5  # an interrupt asks the ranks for their collectives only, this long
PY_SPY_S = 2.5  # how long py-spy may take to read one process (both tries)
REPORT_WAIT_S = 1.5  # how long a --timeout's report waits for the released ranks to stop (then: stopping.py)
STILL_STOPPING_OUTPUT_S = 0.5  # the output wait of a run with ranks still stopping (theirs never completes)


class StillStopping(RuntimeError):
    """A rank released after a --timeout that had not stopped when the timeout was reported."""


@dataclass
class Snapshot:
    """What the ranks were doing at the deadline: the agents' answers and py-spy's native stacks."""

    answers: Answers
    native: dict[int, list[str]] = field(default_factory=dict)
    collectives: dict[int, Any] = field(default_factory=dict)  # rank -> its record (its worker's too)
    world: tuple[int, ...] = ()
    _threads: list[threading.Thread] = field(default_factory=list)

    def wait_native(self, timeout: float = PY_SPY_S + 0.5) -> None:
        """py-spy's reads, all within one `timeout` (a rank whose read is late is shown without it)."""
        end = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))

    def lines(self) -> list[str]:
        """Which collective each rank is in where they differ, then every rank's stack: ranks that
        stand in the same place together; native stacks after."""
        groups = stacks.group(self.answers.results)
        lines = desync_lines(self.collectives, self.answers.results, self.world) if self.collectives else []
        lines += stacks.render(groups, {r: why for r, why in self.answers.missing.items() if r not in self.native})
        for rank in sorted(self.native):
            lines.append(f"rank {rank}: its Python did not answer ({self.answers.missing.get(rank, '')}); "
                         "native stack (py-spy):")
            lines.extend(f"    {line}" for line in self.native[rank])
        return lines

    def headline(self) -> str:
        return stacks.headline(stacks.group(self.answers.results))


def snapshot(cluster: EngineCluster, ranks: Iterable[int]) -> Snapshot:
    """The ranks' stacks and collectives from their agents; py-spy starts at once on those that did not answer."""
    ranks = list(ranks)
    got: dict[str, Any] = {}
    asking = threading.Thread(target=lambda: got.update(c=cluster.agents.ask("collectives", ranks, timeout=ASK_S)),
                              daemon=True)  # beside the stacks, not after them
    asking.start()
    answers = cluster.agents.ask("stacks", ranks, timeout=ASK_S)
    answers.results = stacks.by_rank(answers.results)  # a worker's stack as its rank's (--fresh, torchrun)
    answers.missing = {r: why for r, why in answers.missing.items() if r not in answers.results}
    asking.join(ASK_S + 1.0)
    snap = Snapshot(answers, collectives=records_by_rank(got["c"].results) if "c" in got else {}, world=tuple(ranks))
    for rank in sorted(answers.missing):
        engine = cluster.engines[rank] if rank < len(cluster.engines) else None
        if engine is None or not is_local_host(engine.host):
            continue
        t = threading.Thread(target=_native_into, args=(snap.native, rank, engine.pid), daemon=True)
        t.start()
        snap._threads.append(t)
    return snap


def release(cluster: EngineCluster, running: Iterable[int], finished: Iterable[int]) -> dict[int, Any]:
    """Shut every rank's torch group and stop the cells still running; rank -> the agent's answer.

    Ranks absent from the answer did not answer (their main thread holds the GIL)."""
    ports = list(cluster.controller_ports()) if cluster.running else []
    results: dict[int, Any] = {}
    lock = threading.Lock()

    def ask(ranks: list[int], interrupt: bool) -> None:
        got = cluster.agents.ask("release", ranks, {"protected_ports": ports, "interrupt": interrupt}, timeout=ASK_S)
        with lock:
            results.update(got.results)

    jobs = [threading.Thread(target=ask, args=(list(rs), stop), daemon=True)
            for rs, stop in ((list(running), True), (list(finished), False)) if rs]
    for t in jobs:
        t.start()
    for t in jobs:
        t.join(ASK_S + 1.0)
    return results


def py_spy() -> str | None:
    """py-spy next to this Python (the venv's), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def native_stack(pid: int) -> list[str]:
    """The process's stacks as py-spy reads them (native frames too where it can)."""
    exe = py_spy()
    if exe is None:
        return ["(py-spy is not installed: pip install py-spy)"]
    last = ""
    end = time.monotonic() + PY_SPY_S
    for extra in (["--native"], []):
        try:
            done = subprocess.run([exe, "dump", "--pid", str(pid), *extra], capture_output=True, text=True,
                                  timeout=max(0.1, end - time.monotonic()), check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            last = f"{type(e).__name__}: {e}"
            continue
        if done.returncode == 0 and done.stdout.strip():
            return main_thread(done.stdout)
        last = (done.stderr or done.stdout).strip().splitlines()[0] if (done.stderr or done.stdout).strip() else "failed"
    return [f"(py-spy could not read pid {pid}: {last})"]


def main_thread(dump: str) -> list[str]:
    """The main thread's block of a py-spy dump (the cell's thread; the engine's own threads left out)."""
    blocks: list[list[str]] = []
    for line in dump.splitlines():
        if line.startswith("Thread "):
            blocks.append([line])
        elif blocks and line.strip():
            blocks[-1].append(line.strip())
    main = next((b for b in blocks if '"MainThread"' in b[0]), blocks[0] if blocks else [])
    return main or dump.splitlines()


def _native_into(out: dict[int, list[str]], rank: int, pid: int) -> None:
    out[rank] = native_stack(pid)


def stuck_words(stuck: Mapping[int, Any]) -> str:
    return ", ".join(str(r) for r in sorted(stuck))


def stop_later(cluster: EngineCluster, by_child: list[tuple[Any, Any]], stuck: list[Any], answered: set[int],
               deadline: float) -> list[Any]:
    """The ranks of `stuck` (runner states) whose agent answered are watched until `deadline`
    (cluster/stopping.py) and marked as still stopping; returns the others, to be given up now."""
    later = [st for st in stuck if st.place.rank in answered]
    if later:
        stopping.watch(cluster, {st.place.rank: child for child, st in by_child if st in later}, deadline)
    for st in later:
        st.done, st.finished_at = True, time.monotonic()
        st.error = StillStopping(f"rank {st.place.rank} had not stopped when the timeout was reported")
    return [st for st in stuck if st not in later]


def stopping_ranks(cluster: EngineCluster) -> list[int]:
    """The ranks being watched after this run's --timeout (cluster/stopping.py)."""
    st = cluster.pending_stop
    return sorted(st.pids) if st is not None else []


def output_wait(errors: Iterable[Any]) -> float:
    """How long a run waits for its ranks' last output: a dead engine's or a still-stopping rank's output
    never completes, so those get a short wait only."""
    errors = list(errors)
    if any(isinstance(e, StillStopping) for e in errors):
        return STILL_STOPPING_OUTPUT_S
    return 3.0 if any(failures.is_engine_death(e) for e in errors) else settings().output_wait


def at_interrupt(cluster: EngineCluster | None, running: Iterable[int]) -> list[str]:
    """On an interrupt, before the ranks are stopped: print (and return) which collective each running
    rank was in (their workers' too), where some was in one. The collectives only, within
    INTERRUPT_ASK_S: the user asked to stop; the stacks stay `%dist stacks`' (they take longer)."""
    ranks = list(running)
    if cluster is None or not ranks or not cluster.agents.addresses:
        return []
    try:
        answers = cluster.agents.ask("collectives", ranks, timeout=INTERRUPT_ASK_S)
    except Exception:  # noqa: BLE001 - an interrupt must stop the ranks whatever the asking met
        return []
    lines = desync_lines(records_by_rank(answers.results), None, ranks)
    if lines:
        print("\n".join(["jupyter-dist: at the interrupt, the ranks' collectives:", *lines]), flush=True)
    return lines
