"""Threads kept for the kernel's life that run the live views' timer loops, one run after another.

A live view used to start its two timer threads on its first output and let them end with the run.
During a 32-rank burst of output the kernel's threads all want the GIL (ipyparallel's I/O thread
receiving, the runner handing lines on), and a `Thread.start` waits until the new thread has taken it
once: 0.1-0.4 s measured; a thread's first message to the kernel's IOPub also opens a socket of its own
(ipykernel's event pipe per thread). Meanwhile the sidebar's subshell waited as long. Kept threads
pay both once per kernel.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class _Worker(threading.Thread):
    def __init__(self, pool: KeptThreads, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.pool = pool
        self.jobs: queue.SimpleQueue[tuple[Callable[[], None], threading.Event]] = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            job, done = self.jobs.get()
            try:
                job()
            except Exception:  # noqa: S110 - a view glitch must never end the kept thread
                pass
            finally:  # idle first: a run that waited for `done` then finds this thread idle
                self.pool.idle(self)
                done.set()


class KeptThreads:
    """Runs each job on an idle kept thread, or on a new one (kept afterwards) when none is idle:
    a loop that did not end in time (a chart that draws for seconds) never delays the next run's."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._idle: list[_Worker] = []
        self._count = 0
        self._lock = threading.Lock()

    def run(self, job: Callable[[], None]) -> threading.Event:
        """`job` started on a kept thread; the event is set when it has returned."""
        with self._lock:
            worker = self._idle.pop() if self._idle else None
            if worker is None:
                self._count += 1
                worker = _Worker(self, f"{self.name}-{self._count}")
                worker.start()
        done = threading.Event()
        worker.jobs.put((job, done))
        return done

    def idle(self, worker: _Worker) -> None:
        with self._lock:
            self._idle.append(worker)

    @property
    def started(self) -> int:
        """Threads started so far (each kept)."""
        return self._count


VIEW_THREADS = KeptThreads("jupyter-dist-view")
