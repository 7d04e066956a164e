"""A real Jupyter kernel driven as a notebook drives it, timed as its user waits (benchmarks only).

`Kernel.cell(code)` sends a cell and reads iopub until the kernel is idle and no message (stream,
display, widget comm) has arrived for `QUIET_S`: the cell's time ends at the last message of the
cell or of a widget it updates, so a view still redrawing after `idle` counts, and the quiet wait
itself does not.
"""

from __future__ import annotations

import os
import queue
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
QUIET_S = 0.3
PROBE_EVERY_S = 0.2  # a probe's short cell every this many seconds while a probed cell runs


class Prober(threading.Thread):
    """Sends `1` to a subshell every PROBE_EVERY_S, each after the last one's reply, and times the
    replies. It alone uses the shell channel until `stop` (the probed cell's request is sent before)."""

    def __init__(self, kc: Any, subshell: str) -> None:
        super().__init__(daemon=True)
        self.kc, self.subshell = kc, subshell
        self.times: list[float] = []
        self.spans: list[tuple[float, float]] = []  # each probe's send and reply, time.monotonic()
        self.ids: set[str] = set()
        self._done = threading.Event()
        self.start()

    def run(self) -> None:
        while not self._done.wait(PROBE_EVERY_S):
            msg = self.kc.session.msg("execute_request", {"code": "1", "silent": True, "store_history": False,
                                                          "user_expressions": {}, "allow_stdin": False,
                                                          "stop_on_error": False})
            msg["header"]["subshell_id"] = self.subshell
            self.ids.add(msg["header"]["msg_id"])
            t0 = time.monotonic()
            self.kc.shell_channel.send(msg)
            while self.kc.get_shell_msg(timeout=120)["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
                pass  # the probed cell's own reply
            t1 = time.monotonic()
            self.times.append(t1 - t0)
            self.spans.append((t0, t1))

    def stop(self) -> list[float]:
        self._done.set()
        self.join(130)
        return self.times


def probe_text(times: list[float]) -> str:
    """A probed cell's subshell replies: how many, median and worst, in ms."""
    if not times:
        return "no probe answered during it"
    every = ", ".join(f"{t * 1e3:.0f}" for t in times[:24])
    return (f"{len(times)} probes, median {statistics.median(times) * 1e3:.0f} ms, worst {max(times) * 1e3:.0f} ms "
            f"(in order: {every}{', ...' if len(times) > 24 else ''})")


def kernel_env() -> dict[str, str]:
    """This environment, with the venv's `mpiexec` first on PATH and Open MPI allowed to run as root
    and to oversubscribe (ipyparallel's MPI launcher needs all three here); tests' state directory."""
    env = dict(os.environ)
    venv_bin = str(ROOT / ".venv" / "bin")
    env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe")
    env.setdefault("JUPYTER_DIST_DIR", str(ROOT / "test-artifacts" / "state"))
    env.setdefault("PYTHONPATH", str(ROOT))
    return env


@dataclass
class Cell:
    """What one cell cost the notebook: seconds until its last message, messages by type, bytes."""

    seconds: float
    counts: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    stream_lines: int = 0
    error: str | None = None
    displays: dict[str, str] = field(default_factory=dict)  # text/plain of each display, its last update
    probes: list[float] = field(default_factory=list)  # seconds a subshell's short cell took, during this one
    probe_spans: list[tuple[float, float]] = field(default_factory=list)  # each one's send and reply (monotonic)
    misparented: int = 0  # this cell's messages that arrived with a probe's msg_id as their parent

    @property
    def lines(self) -> int:
        """Lines the notebook shows at the end: streams, and each display's text in its last state."""
        return self.stream_lines + sum(text.count("\n") for text in self.displays.values())

    def check(self) -> Cell:
        if self.error:
            raise RuntimeError(self.error)
        return self


class Kernel:
    """A python3 kernel started with `kernel_env()`; `started` is the seconds it took to be ready."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        from jupyter_client.manager import start_new_kernel  # heavy: only a benchmark needs it

        t0 = time.perf_counter()
        self.km, self.kc = start_new_kernel(kernel_name="python3", env=env or kernel_env())
        self.started = time.perf_counter() - t0

    def subshell(self) -> str:
        """A new kernel subshell (ipykernel 7): its cells run in a thread of their own while the main
        shell runs a cell, as the sidebar's requests do."""
        self.kc.control_channel.send(self.kc.session.msg("create_subshell_request", {}))
        return self.kc.control_channel.get_msg(timeout=30)["content"]["subshell_id"]

    def cell(self, code: str, timeout: float = 900, quiet: float = QUIET_S, probe: str | None = None) -> Cell:
        """`probe`: a subshell on which a short cell (`1`) is run every PROBE_EVERY_S while this cell
        runs; its reply times are the cell's `probes` (how responsive the notebook stays)."""
        t0 = time.perf_counter()
        msg_id = self.kc.execute(code)
        got = Cell(0.0)
        prober = Prober(self.kc, probe) if probe else None
        last = t0
        idle = False
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=quiet if idle else timeout)
            except queue.Empty:
                if idle:
                    break
                raise TimeoutError(f"no message for {timeout} s from: {code[:80]!r}") from None
            kind = msg["msg_type"]
            parent = msg["parent_header"].get("msg_id")
            mine = parent == msg_id
            if prober is not None and parent in prober.ids and kind != "status":
                got.misparented += 1  # printed by this cell while a probe ran: the kernel gave it the probe's parent
                mine = True
            if not (mine or kind.startswith("comm")):
                continue
            last = time.perf_counter()
            got.counts[kind] = got.counts.get(kind, 0) + 1
            content = msg["content"]
            got.bytes += len(str(content))
            if kind == "stream":
                got.stream_lines += content["text"].count("\n")
            elif kind in ("display_data", "update_display_data"):
                key = content.get("transient", {}).get("display_id") or str(len(got.displays))
                got.displays[key] = content.get("data", {}).get("text/plain", "")
            elif kind == "error" and mine:
                got.error = "\n".join(content["traceback"])
            elif kind == "status" and mine and content["execution_state"] == "idle":
                idle = True
                if prober is not None:  # its replies' messages would keep the quiet wait from ending
                    got.probes, got.probe_spans = prober.stop(), prober.spans
        got.seconds = last - t0
        return got

    def value(self, expr: str) -> Any:
        """`expr` evaluated in the kernel (a literal: numbers, strings, dicts of them)."""
        import ast

        msg_id = self.kc.execute("", user_expressions={"v": expr})
        reply = self.kc.get_shell_msg(timeout=120)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self.kc.get_shell_msg(timeout=120)
        v = reply["content"]["user_expressions"]["v"]
        if v.get("status") != "ok":
            raise RuntimeError(f"{expr}: {v.get('evalue')}")
        return ast.literal_eval(v["data"]["text/plain"])

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


def alternate(fa: Any, fb: Any, repeat: int) -> tuple[list[float], list[float]]:
    """`fa()` and `fb()` (each returns seconds) in alternating order, round by round."""
    ta: list[float] = []
    tb: list[float] = []
    for i in range(repeat):
        order = ((fa, ta), (fb, tb)) if i % 2 == 0 else ((fb, tb), (fa, ta))
        for fn, times in order:
            times.append(fn())
    return ta, tb
