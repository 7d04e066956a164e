"""Every rank's CPU, memory and GPU while a run goes: polled from the ranks' agents, kept per rank.

The engines sample themselves about once a second (engine/resources.py); `ResourcePoller` asks
their agents for the samples since the last ones it has, once a second, on a thread of its own
(the agents answer while the cell runs), into a `ResourceStore` the views draw live and summarise
at the end. `near_limit` names a rank whose host (or cgroup) memory, or GPU memory, is nearly full.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_dist.cluster.agents import RankAgents
from jupyter_dist.engine.resources import SWITCH

POLL_S = 1.0
NEAR_LIMIT = 0.9  # of the host's (cgroup's) memory in use, or of a GPU's memory
GIB = 1 << 30


@dataclass
class ResourceStore:
    """Samples by rank, oldest first (each as engine/resources.py makes it). Thread-safe."""

    samples: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    version: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, rank: int, samples: list[dict[str, Any]]) -> None:
        if samples:
            with self._lock:
                self.samples.setdefault(rank, []).extend(samples)
                self.version += 1

    @property
    def empty(self) -> bool:
        return not any(self.samples.values())

    def since(self, rank: int) -> float:
        with self._lock:
            got = self.samples.get(rank)
            return got[-1]["t"] if got else 0.0

    def copy(self) -> dict[int, list[dict[str, Any]]]:
        with self._lock:
            return {r: list(s) for r, s in self.samples.items()}

    def latest(self) -> dict[int, dict[str, Any]]:
        with self._lock:
            return {r: s[-1] for r, s in self.samples.items() if s}

    def peak_rss(self) -> dict[int, int]:
        with self._lock:
            return {r: max(x["rss"] for x in s) for r, s in self.samples.items() if s}

    def near_limit(self) -> list[str]:
        """'rank 2: host memory 93% used (rank's 12.0 GiB)', from each rank's latest sample."""
        out = []
        for rank, s in sorted(self.latest().items()):
            total = s.get("mem_total") or 0
            if total and 1 - s.get("mem_avail", total) / total >= NEAR_LIMIT:
                used = 1 - s["mem_avail"] / total
                out.append(f"rank {rank}: host memory {used:.0%} used (the rank's {s['rss'] / GIB:.1f} GiB)")
            for g in s.get("gpus") or []:
                if g.get("mem_total") and g["mem_used"] / g["mem_total"] >= NEAR_LIMIT:
                    out.append(f"rank {rank}: GPU {g['index']} memory {g['mem_used'] / g['mem_total']:.0%} used "
                               f"(the rank's {g['mem'] / GIB:.1f} GiB)")
        return out

    def summary_lines(self) -> list[str]:
        """One line per rank: CPU mean and peak, peak resident memory, GPU utilisation and memory."""
        lines = []
        for rank, s in sorted(self.copy().items()):
            if not s:
                continue
            cpus = [x["cpu"] for x in s]
            line = (f"rank {rank}: CPU {sum(cpus) / len(cpus):.0f}% mean, {max(cpus):.0f}% peak; "
                    f"memory {max(x['rss'] for x in s) / GIB:.2f} GiB peak")
            gpus = [g for x in s for g in x.get("gpus") or []]
            if gpus:
                line += (f"; GPU {max(g['util'] for g in gpus)}% peak utilisation, "
                         f"{max(g['mem'] for g in gpus) / GIB:.2f} GiB peak memory")
            lines.append(line)
        return lines


def by_rank(answers: dict[int, Any]) -> dict[int, list[dict[str, Any]]]:
    """Each rank's samples from the agents' answers, its workers' figures in place of its engine's.

    An engine that waits on workers (--fresh's child, torchrun's workers) samples them too
    (engine/resources.py's "workers": rank None is the engine's own); a worker's figures are its
    rank's, over those of the engine of that rank (torchrun: rank 1's engine is idle meanwhile)."""
    own: dict[int, list[dict[str, Any]]] = {}
    from_workers: dict[int, list[dict[str, Any]]] = {}
    for rank, got in answers.items():
        own.setdefault(rank, [])
        for s in (got or {}).get("samples", []):
            base = {k: v for k, v in s.items() if k != "workers"}
            if not s.get("workers"):
                own[rank].append(base)
            for w in s.get("workers") or []:
                r = rank if w.get("rank") is None else int(w["rank"])
                from_workers.setdefault(r, []).append({**base, "cpu": w["cpu"], "rss": w["rss"],
                                                       "gpus": w.get("gpus") or [], "pid": w["pid"]})
    return {**own, **{r: sorted(s, key=lambda x: x["t"]) for r, s in from_workers.items()}}


class ResourcePoller:
    """While a run goes (`with poller:`), the ranks' new samples into `store` once a second.

    One thread per kernel serves every poller in turn (`_LOOP`): entering and leaving a run costs
    setting an event, not starting and joining a thread, which a 15 ms warm cell would feel."""

    def __init__(self, agents: RankAgents, store: ResourceStore | None = None, interval: float = POLL_S,
                 on_update: Callable[[ResourceStore], None] | None = None) -> None:
        self.agents = agents
        self.store = store if store is not None else ResourceStore()
        self.interval = interval
        self.on_update = on_update
        self.started = 0.0  # samples from before the run (the engine keeps ten minutes) are not its

    def poll(self) -> None:
        """Once: every rank's samples since the last one kept."""
        ranks = sorted(self.agents.addresses)
        if not ranks:
            return
        since = max(self.started, min((self.store.since(r) for r in ranks), default=0.0))
        answers = self.agents.ask("resources", ranks, {"since": since}, timeout=self.interval)
        for rank, got in by_rank(answers.results).items():
            floor = max(self.store.since(rank), self.started)
            self.store.add(rank, [x for x in got if x.get("t", 0) > floor])
        if self.on_update is not None:
            self.on_update(self.store)

    def __enter__(self) -> ResourcePoller:
        self.started = time.time() - self.interval / 2
        if self.agents.addresses and os.environ.get(SWITCH, "1") != "0":  # off: benchmarks/README.md
            _LOOP.serve(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _LOOP.leave(self)


class _Loop:
    """The kernel's one polling thread: polls the current run's poller every `interval` seconds."""

    def __init__(self) -> None:
        self.cpu_s = 0.0  # this thread's CPU time in polls (benchmarks/ddp_throughput.py --observe reads it)
        self.current: ResourcePoller | None = None
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None

    def serve(self, poller: ResourcePoller) -> None:
        with self.lock:
            self.current = poller
            self.wake.set()
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="jupyter-dist resources", daemon=True)
                self.thread.start()

    def leave(self, poller: ResourcePoller) -> None:
        with self.lock:
            if self.current is poller:
                self.current = None

    def _run(self) -> None:
        while True:
            self.wake.wait()
            with self.lock:
                poller = self.current
            time.sleep(poller.interval if poller is not None else 0.0)
            with self.lock:
                if self.current is None:
                    self.wake.clear()  # under the lock: a run that starts now sets it again
                    continue
                poller = self.current
            c0 = time.thread_time()
            with contextlib.suppress(Exception):  # a missed poll must never stop the polling
                poller.poll()
            self.cpu_s += time.thread_time() - c0


_LOOP = _Loop()
