"""A real Jupyter kernel driven as a notebook drives it, timed as its user waits (benchmarks only).

`Kernel.cell(code)` sends a cell and reads iopub until the kernel is idle and no message (stream,
display, widget comm) has arrived for `QUIET_S`: the cell's time ends at the last message of the
cell or of a widget it updates, so a view still redrawing after `idle` counts, and the quiet wait
itself does not.
"""

from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
QUIET_S = 0.3


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

    def cell(self, code: str, timeout: float = 900, quiet: float = QUIET_S) -> Cell:
        t0 = time.perf_counter()
        msg_id = self.kc.execute(code)
        got = Cell(0.0)
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
            mine = msg["parent_header"].get("msg_id") == msg_id
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
