"""One run: set each rank up, execute, stream output, fail fast, gather.

The notebook's main thread drives everything here; output is printed from it so that
it lands in the running cell's output area.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_dist.cluster.crash_records import crash_records
from jupyter_dist.cluster.engines import EngineCluster
from jupyter_dist.cluster.profile import state_dir
from jupyter_dist.cluster.retention import prune_all
from jupyter_dist.common import channel
from jupyter_dist.engine import setup as engine_side
from jupyter_dist.engine.cells import CELL_LABEL
from jupyter_dist.engine.faults import abort_collectives
from jupyter_dist.errors import RankFailure
from jupyter_dist.plan.layout import Layout, RankPlace
from jupyter_dist.plan.settings import settings
from jupyter_dist.run import failures, hangs
from jupyter_dist.run.children import child_error, child_result
from jupyter_dist.run.fetch import fetch_variable
from jupyter_dist.run.flood import FloodWatch
from jupyter_dist.run.output import LineBuffer, OutputSink, RankLogs, TextSink, emit
from jupyter_dist.run.stdin import answer_input
from jupyter_dist.run.streams import DRAIN_CHARS, DRAIN_GAP_S, DRAIN_SLICE_S, SWITCH_S, RankStream, RunStreams

POLL_FIRST_S = 0.05  # a short cell ends within it, with no poll in between
POLL_S = 0.01  # while output flows
POLL_MAX_S = 0.1  # while the ranks are quiet
STUCK_WAIT_S = 1.0  # how long a rank whose agent did not answer gets to stop before it is given up
DEATH_NOTE_WAIT_S = 10.0  # how long mpiexec may take to report a dead rank's exit code or signal
STREAMS = ("stdout", "stderr")
_RUN_NUMBERS = itertools.count(1)  # with the pid, names each run's log folder uniquely
_PRUNED = [-1e9]  # when old folders were last pruned (monotonic)


@dataclass
class Execution:
    """What the runner needs for one dispatch: who runs what, and how to label it."""

    code: str
    ranks: tuple[int, ...]
    layout: Layout
    timeout: float | None = None
    shown: tuple[int, ...] | None = None
    out: str | None = None
    label: str = "cell"


@dataclass
class RankState:
    place: RankPlace
    engine_id: int
    buffers: dict[str, LineBuffer] = field(default_factory=dict)  # a stream's by its first text: none for a quiet cell
    stream: RankStream = field(default_factory=RankStream)  # its stream messages as they arrive
    displays: int = 0
    done: bool = False
    error: Any = None
    finished_at: float | None = None
    exit_code: int | None = None  # the code a rank gave os._exit, if it did


@dataclass
class RunOutcome:
    ok: bool
    elapsed: float
    log_dir: Path
    values: dict[int, Any] = field(default_factory=dict)
    failed: list[int] = field(default_factory=list)
    lines: dict[int, int] = field(default_factory=dict)


class Runner:
    def __init__(self, cluster: EngineCluster, sink_factory: Callable[[], OutputSink] = TextSink) -> None:
        self.cluster = cluster
        self.sink_factory = sink_factory
        self._views_key: tuple[int, tuple[int, ...]] | None = None
        self._view_obj: Any = None
        self._group_gone = False  # a rank said the cell destroyed its torch group (engine.torch_group_gone)
        self.last_stacks: hangs.Snapshot | None = None  # the stacks a --timeout took
        self.timeout_phases: dict[str, float] = {}  # seconds each step of the last --timeout report took
        self._crashes: dict[int, str] = {}  # dead ranks' crash records, shown as their stacks
        self._backlog, self._drain_from = False, 0  # text left by the last drain; the rank whose turn is next
        self._drained = 0  # characters the last drain handed on
        self._flood = FloodWatch(cluster)  # a crowded node's engines weigh less meanwhile

    # -- set-up --------------------------------------------------------------------

    def setup(self, envs: dict[int, dict[str, str]], hooks: tuple[Callable[[], None], ...], cwd: str) -> None:
        """Push environments and hooks; skipped when the engines already have exactly these."""
        key = (envs, hooks, cwd)
        if self.cluster.applied == key:
            return
        client = self.cluster.client
        ids = [e.engine_id for e in self.cluster.engines]
        client[ids].apply_sync(engine_side.setup, envs, hooks, cwd)
        self.cluster.applied = key

    # -- execution -----------------------------------------------------------------

    def _view(self, client: Any, ids: tuple[int, ...]) -> Any:
        """The DirectView on `ids`, kept while the client and engines are the same (one per cell
        would cost a view's set-up on every run)."""
        key = (id(client), ids)
        if self._views_key != key:
            self._views_key, self._view_obj = key, client[list(ids)]
        return self._view_obj

    def execute(self, ex: Execution, sink: OutputSink | None = None, on_sent: Callable[[], None] | None = None) -> RunOutcome:
        """Run `ex` on its ranks; `on_sent` is bookkeeping that can wait until the ranks have the cell."""
        cluster = self.cluster
        view = self._view(cluster.client, tuple(cluster.engines[r].engine_id for r in ex.ranks))
        t0 = time.monotonic()
        # sent first: the ranks start while the notebook side (logs, view, status) is set up;
        # nothing reaches the view before the monitor drains it
        # silent, labelled: no execute_input message per rank; engine_cells shows the cell's value
        ar = view.execute(ex.code, silent=True, block=False, label=CELL_LABEL)
        streams = RunStreams(cluster.client, list(ar._children))
        states = {r: RankState(ex.layout.place(r), cluster.engines[r].engine_id, stream=s)
                  for r, s in zip(ex.ranks, streams.ranks, strict=True)}
        by_child = list(zip(ar._children, states.values(), strict=True))
        if on_sent is not None:
            on_sent()
        sink = sink or self.sink_factory()
        logs = RankLogs(state_dir() / "logs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_RUN_NUMBERS)}",
                        ex.layout.world_size)
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, SWITCH_S))  # the main thread's drains yield the GIL sooner
        try:
            cluster.set_busy(True)
            # every rank of the layout: a node leader may print lines of ranks it launched (torchrun)
            sink.start(ex.layout.places(), ex.shown, logs)
            self._monitor(ar, by_child, ex, sink, logs, t0)
        finally:
            cluster.set_busy(False)
            self._flood.end()
            sys.setswitchinterval(switch)
            # every line the ranks printed arrives before the view is closed; a dead engine's
            # output never completes, so it gets a short wait only
            with contextlib.suppress(Exception):
                ar.wait_for_output(hangs.output_wait([st.error for st in states.values()]))
            streams.settled()
            while self._drain(by_child, sink, logs) and self._backlog:
                time.sleep(DRAIN_GAP_S)
            self._drain(by_child, sink, logs, final=True)
            streams.detach()
            sink.finish()
            logs.close()
            prune_old_folders()
            if self._group_gone:
                # a re-made group on the same port could meet the old store: the next run gets a new one
                self._group_gone = False
                cluster.rotate_master_port()
        elapsed = time.monotonic() - t0
        failed = failures.in_order(failures.from_error(s.place, s.error, s.finished_at or 0, s.exit_code)
                                   for s in states.values() if s.error is not None)
        outcome = RunOutcome(not failed, elapsed, logs.dir, failed=[f.rank for f in failed], lines=dict(logs.counts))
        if failed:
            raise self._failure(failed, [s.place.rank for s in states.values() if s.error is None])
        for child, s in by_child:
            content = child_result(child)
            if content:
                sink.result(s.place.rank, content)
        if ex.out:
            outcome.values = self.fetch(ex.out, ex.ranks)
        return outcome

    def _monitor(self, ar: Any, by_child: list[tuple[Any, RankState]], ex: Execution,
                 sink: OutputSink, logs: RankLogs, t0: float) -> None:
        deadline = t0 + ex.timeout if ex.timeout else None
        first_fail: float | None = None
        stopped = False
        poll = POLL_FIRST_S
        fail_grace = grace = settings().fail_grace
        try:
            while True:
                # the end of the run wakes this wait at once, whatever the poll; between polls the
                # ranks' output waits in ipyparallel's buffers. Quiet ranks are polled less and less
                # often (to POLL_MAX_S) so that a long run leaves the cores to them.
                ready = ar.wait(poll)
                if not ready:  # once ready, the final drain (after the output wait) hands on the rest
                    came = self._drain(by_child, sink, logs)
                    self._flood.after_drain(self._backlog, self._drained, time.monotonic())
                    poll = (DRAIN_GAP_S if self._backlog else POLL_S) if came else min(poll * 2, POLL_MAX_S)
                    sink.tick(time.monotonic() - t0)  # e.g. the live view shown once a run outlives a short cell
                now = time.monotonic()
                for child, st in by_child:
                    if not st.done and child.done():
                        st.done, st.finished_at = True, now
                        exc = child_error(child)
                        if exc is not None:
                            st.error = exc
                            sink.rank_failed(st.place.rank)
                            if first_fail is None:  # a dead rank's peers cannot finish with it: less grace
                                first_fail = now
                                grace = settings().death_grace if failures.is_engine_death(exc) else fail_grace
                            poll = POLL_S
                            # its peers in a collective error out once its group is gone, and
                            # so on around the ring: each failed rank releases the next
                            self._abort_groups([st])
                if ready:
                    return
                if first_fail is not None and not stopped and now - first_fail > grace:
                    # the ranks still running are stopped; the loop records how each ended
                    self._stop_all(ar, by_child, sink, logs)
                    stopped = True
                if deadline is not None and now > deadline:
                    self._on_timeout(ar, by_child, ex, sink, logs)
        except KeyboardInterrupt:
            hangs.at_interrupt(self.cluster, [st.place.rank for _, st in by_child if not st.done])
            self._stop_all(ar, by_child, sink, logs)
            raise

    def _on_timeout(self, ar: Any, by_child: list[tuple[Any, RankState]], ex: Execution,
                    sink: OutputSink, logs: RankLogs) -> None:
        """Past --timeout: every running rank's stack (agents, py-spy), then all released; raises."""
        running = [st.place.rank for _, st in by_child if not st.done]
        t0 = time.monotonic()
        snap = hangs.snapshot(self.cluster, running)
        t1 = time.monotonic()
        stuck = self._stop_all(ar, by_child, sink, logs, deaf=set(snap.answers.missing), wait=hangs.REPORT_WAIT_S)
        t2 = time.monotonic()
        snap.wait_native()
        self.last_stacks = snap
        self.timeout_phases = {"stacks": t1 - t0, "stop": t2 - t1, "native": time.monotonic() - t2}
        raise failures.timeout_report(ex.timeout or 0, running, snap.lines(), stuck, hangs.stopping_ranks(self.cluster))

    def _stop_all(self, ar: Any, by_child: list[tuple[Any, RankState]], sink: OutputSink, logs: RankLogs,
                  deaf: set[int] | None = None, wait: float | None = None) -> list[int]:
        """Release every rank of the run from its collectives and stop the running cells, through the
        agents (the nanny's SIGINT for ranks whose agent does not answer, and for `deaf` ones, whose
        agent just did not); the ranks that did not stop are killed, to be replaced by the next run.
        Returns those."""
        running = [st for _, st in by_child if not st.done]
        deaf = deaf or set()
        answered = hangs.release(self.cluster, [st.place.rank for st in running if st.place.rank not in deaf],
                                 [st.place.rank for _, st in by_child if st.done])
        self.interrupt([st for st in running if st.place.rank not in answered])
        self.cluster.rotate_master_port()  # the old group's store may still hold the port
        # only a --timeout (`wait`) gives up early on ranks whose agent did not answer: after a failure or
        # an interrupt a loaded machine's slow agent must not cost a rank its engine (interrupt_grace)
        return self._wait_stopped(ar, by_child, sink, logs, set(answered) if wait is not None else None, wait)

    def _wait_stopped(self, ar: Any, by_child: list[tuple[Any, RankState]], sink: OutputSink, logs: RankLogs,
                      answered: set[int] | None = None, wait: float | None = None) -> list[int]:
        """Wait for the ranks to stop: up to interrupt_grace, but only STUCK_WAIT_S once every rank still
        running is one whose agent did not answer (its main thread holds the GIL in native code). With
        `wait`, only that long: answered ranks still running are then watched for the rest of the grace
        (hangs.stop_later), the others given up now."""
        t0 = time.monotonic()
        end = t0 + min(settings().interrupt_grace, wait if wait is not None else 1e9)
        while not ar.wait(0.05) and time.monotonic() < end:
            self._drain(by_child, sink, logs)
            left = [st for child, st in by_child if not child.done()]
            if answered is not None and time.monotonic() - t0 > STUCK_WAIT_S and \
                    all(st.place.rank not in answered for st in left):
                break
        stuck = [st for child, st in by_child if not child.done()]
        if wait is not None and answered:
            stuck = hangs.stop_later(self.cluster, by_child, stuck, answered, t0 + settings().interrupt_grace)
        if stuck:
            self._give_up(stuck, "did not stop after the interrupt")
        return [st.place.rank for st in stuck]

    def _give_up(self, pending: list[RankState], why: str) -> None:
        """Ranks stuck in native code: their engines are killed now and replaced by the next run."""
        for st in pending:
            st.done, st.error = True, RuntimeError(f"rank {st.place.rank} {why}; its engine is replaced "
                                                   "by the next run (its variables are lost)")
            st.finished_at = time.monotonic()
        self.cluster.start_replacements([st.place.rank for st in pending])

    def _drain(self, by_child: list[tuple[Any, RankState]], sink: OutputSink, logs: RankLogs, final: bool = False) -> bool:
        """Hand on what arrived since the last call; True if the ranks printed or displayed anything.
        Unless `final`, a burst is handed on in slices of DRAIN_SLICE_S, the ranks taking turns (each
        at most DRAIN_CHARS a turn), so that the notebook's other threads are not starved;
        `self._backlog` then says that text is left."""
        came = False
        end = None if final else time.monotonic() + DRAIN_SLICE_S
        n = len(by_child)
        self._backlog, self._drained = False, 0
        for i in range(n):
            child, st = by_child[(self._drain_from + i) % n]
            if end is not None and time.monotonic() > end:
                self._backlog, self._drain_from = True, (self._drain_from + i) % n
                break
            md = child.output.metadata
            # count displays before taking the text: ipyparallel's thread queues a rank's text before
            # it appends a display sent after it, so every display counted here has its text queued
            outputs = md.get("outputs") or []
            n_out = len(outputs)
            # the chunks that arrived since the last call (run/streams.py), each read once
            for stream, text in st.stream.take(None if final else DRAIN_CHARS):
                self._drained += len(text)
                buf = st.buffers.get(stream) or st.buffers.setdefault(stream, LineBuffer())
                lines = buf.feed(text)
                if lines:
                    came = True
                    emit(st.place.rank, stream, lines, sink, logs)
            if st.stream.pending and not final:  # its displays wait for the text queued before them
                self._backlog = came = True
                continue
            if final:
                for stream in STREAMS:
                    lines = st.buffers[stream].flush() if stream in st.buffers else None
                    if lines:
                        came = True
                        emit(st.place.rank, stream, lines, sink, logs)
            while st.displays < n_out:
                content = outputs[st.displays]
                st.displays += 1
                item = channel.message_in(content)
                if item is not None and item.get("key") == channel.EXIT:
                    st.exit_code = item["data"]["code"]
                elif item is not None and item.get("key") == channel.GROUP_GONE:
                    self._group_gone = True
                elif item is not None and item.get("key") == channel.INPUT:  # a script's input() (run/stdin.py)
                    answer_input(self.cluster.agents, st.place.rank, item["data"])
                elif item is not None:  # metrics, every 0.5-2 s: not a reason to poll faster
                    sink.collected(st.place.rank, item)
                else:
                    came = True
                    sink.display(st.place.rank, content)
        return came

    # -- control -------------------------------------------------------------------

    def interrupt(self, states: list[RankState]) -> None:
        """SIGINT to each rank on its own path (the engine's nanny), not through mpiexec."""
        ids = [st.engine_id for st in states]
        if ids:
            with contextlib.suppress(Exception):
                self.cluster.client.send_signal(signal.SIGINT, targets=ids, block=True)

    def _abort_groups(self, failed: list[RankState]) -> None:
        """Tear down the failed ranks' process groups so their peers' collectives error out."""
        ids = [st.engine_id for st in failed]
        with contextlib.suppress(Exception):
            self.cluster.client[ids].apply_async(abort_collectives, self.cluster.controller_ports())
        # the old group's store may still hold the master port: the next group gets a fresh one
        self.cluster.rotate_master_port()

    # -- results -------------------------------------------------------------------

    def fetch(self, name: str, ranks: tuple[int, ...]) -> dict[int, Any]:
        return fetch_variable(self.cluster, name, ranks)

    def _failure(self, failed: list[failures.Failure], finished: list[int]) -> RankFailure:
        noted = failures.with_notes(failed, self._death_notes(failed))
        error = failures.rank_failure(failures.with_crash_stacks(noted, self._crashes), finished)
        dead = [f.rank for f in failed if f.died]
        if dead and self.cluster.running:  # started now: registered by the time the next cell runs
            with contextlib.suppress(Exception):
                self.cluster.start_replacements(dead)
        return error

    def _death_notes(self, failed: list[failures.Failure]) -> dict[int, str]:
        """How dead ranks ended: the exit code a rank announced or its crash file, else mpiexec's
        report of its exit code or signal, which comes a moment after the engine is gone."""
        dead = [f for f in failed if f.died]
        if not dead:
            return {}
        stack_dir = self.cluster.stack_dir if self.cluster.running else None
        # from the state folder, else from the node's live ranks (no shared folder: cluster/crash_records.py)
        crashes = crash_records(self.cluster, [f.rank for f in dead if f.exit_code is None],
                                dead=[f.rank for f in dead]) if stack_dir else {}
        self._crashes = crashes
        notes = failures.local_notes(dead, crashes)
        if notes:
            return notes
        end = time.monotonic() + DEATH_NOTE_WAIT_S
        while True:
            launcher_done = not self.cluster.launcher_running()
            notes = self.cluster.death_notes()
            if notes or launcher_done or time.monotonic() > end:
                return notes or (self.cluster.death_notes() if launcher_done else notes)
            time.sleep(0.1)


def prune_old_folders(every_s: float = 60.0) -> None:
    """Old log and profile folders past the setting (cluster/retention.py), at most once a minute."""
    now = time.monotonic()
    if now - _PRUNED[0] >= every_s:
        _PRUNED[0] = now
        with contextlib.suppress(OSError):
            prune_all()

