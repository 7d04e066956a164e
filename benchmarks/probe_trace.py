"""Why a subshell waited during a burst: each probe beside what the kernel's threads did meanwhile (issue #19).

`.venv/bin/python benchmarks/probe_trace.py [--ranks 32] [--rounds 8] [--no-px]`: a real kernel, a
`%%distrun -f mpi -N 1 -n RANKS` cluster and (unless --no-px) an ipyparallel MPI cluster of the same size,
then ROUNDS rounds of a 100,000-line burst on each, alternating, with a subshell's `1` every 0.2 s (as
benchmarks/notebook.py). While each burst runs, every 5 ms: each kernel thread's CPU time and runqueue wait
(`/proc/PID/task/TID/schedstat`) and state, and the autogroup nice of the ranks' session. For each probe
over --slow ms it prints, per thread, how long it ran and how long it was runnable and not run in the
probe's window: runnable and not run is the scheduler's doing (the session's weight); sleeping while
another kernel thread runs is the GIL's or a lock's. Then, for each %%distrun burst, when the nice went
up and down beside its probes. A diagnostic: it compares nothing, so it prints no ratio.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Any

import psutil
from nbkernel import Kernel, probe_text
from notebook import BURST, IPP_CLEANUP, IPP_STOP, ipp_start_code

SAMPLE_S = 0.005


class Sampler(threading.Thread):
    """Samples the kernel's threads and the ranks' session nice while `on` is set."""

    def __init__(self, kernel_pid: int, session_pid: int) -> None:
        super().__init__(daemon=True)
        self.kernel_pid, self.nice_path = kernel_pid, f"/proc/{session_pid}/autogroup"
        self.samples: list[tuple[float, dict[str, tuple[int, int, str]], str]] = []
        self.on = threading.Event()
        self.start()

    def run(self) -> None:
        while True:
            self.on.wait()
            self.samples.append((time.monotonic(), self._threads(), self._nice()))
            time.sleep(SAMPLE_S)

    def _threads(self) -> dict[str, tuple[int, int, str]]:
        got = {}
        for tid in os.listdir(f"/proc/{self.kernel_pid}/task"):
            try:
                with open(f"/proc/{self.kernel_pid}/task/{tid}/schedstat") as f:
                    ran, waited, _ = f.read().split()
                with open(f"/proc/{self.kernel_pid}/task/{tid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            got[tid] = (int(ran), int(waited), state)
        return got

    def _nice(self) -> str:
        try:
            with open(self.nice_path) as f:
                return f.read().split()[-1]
        except OSError:
            return "?"


def ranks_session(kernel_pid: int) -> int:
    """The session that holds most of the kernel's descendants, other than the kernel's: the ranks'."""
    by_sid: dict[int, int] = {}
    for p in psutil.Process(kernel_pid).children(recursive=True):
        try:
            by_sid[os.getsid(p.pid)] = by_sid.get(os.getsid(p.pid), 0) + 1
        except OSError:
            continue
    by_sid.pop(os.getsid(kernel_pid), None)
    return max(by_sid, key=by_sid.__getitem__)


def explain(names: dict[str, str], samples: list[Any], t0: float, t1: float) -> list[str]:
    """Per kernel thread, in the window [t0, t1]: ms run, ms runnable and not run, its states."""
    window = [s for s in samples if t0 - 0.02 <= s[0] <= t1 + 0.02]
    if len(window) < 2:
        return ["  (no samples in the window)"]
    first, last = window[0], window[-1]
    lines = [f"  session nice {sorted({s[2] for s in window})}, largest gap between samples "
             f"{max(b[0] - a[0] for a, b in zip(window, window[1:], strict=False)) * 1e3:.0f} ms"]
    for tid, (ran0, waited0, _) in first[1].items():
        if tid not in last[1]:
            continue
        ran, waited = (last[1][tid][0] - ran0) / 1e6, (last[1][tid][1] - waited0) / 1e6
        if ran + waited >= 5:
            states = "".join(s[1].get(tid, (0, 0, "-"))[2] for s in window)[:80]
            lines.append(f"  {names.get(tid, tid)[:28]:28s} ran {ran:5.0f} ms, runnable {waited:5.0f} ms  {states}")
    return lines


def nice_changes(samples: list[Any], t0: float) -> str:
    changes, last = [], None
    for t, _, nice in samples:
        if nice != last:
            changes.append(f"{nice} at {t - t0:.2f} s")
            last = nice
    return ", ".join(changes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--total", type=int, default=100_000, help="lines of a burst, over all ranks")
    ap.add_argument("--slow", type=float, default=100, help="explain probes that waited this many ms or more")
    ap.add_argument("--no-px", action="store_true", help="no ipyparallel cluster beside (the burst alone)")
    args = ap.parse_args()
    k = Kernel()
    px = not args.no_px
    kernel_pid = k.km.provisioner.process.pid
    try:
        k.cell("%load_ext jupyter_dist").check()
        flags = f"-f mpi -N 1 -n {args.ranks}"
        k.cell(f"%%distrun {flags}\nx = 1").check()
        if px:
            k.cell(ipp_start_code(args.ranks)).check()
        sub = k.subshell()
        sampler = Sampler(kernel_pid, ranks_session(kernel_pid))
        cells = {"%%distrun": f"%%distrun {flags}\n" + BURST.format(n=args.total // args.ranks)}
        if px:
            cells["%%px"] = "%%px_ipp --block --stream\n" + BURST.format(n=args.total // args.ranks)
        k.cell(cells["%%distrun"], probe=sub)  # the live view's threads exist from here on
        names = {str(tid): name for tid, name in
                 k.value("{t.native_id: t.name for t in __import__('threading').enumerate()}").items()}
        for r in range(args.rounds):
            for label in (list(cells) if r % 2 == 0 else list(reversed(cells))):
                sampler.samples = []
                sampler.on.set()
                t0 = time.monotonic()
                c = k.cell(cells[label], probe=sub)
                sampler.on.clear()
                print(f"round {r} {label}: {c.seconds:.2f} s; {probe_text(c.probes)}", flush=True)
                if label == "%%distrun":
                    print(f"  ranks' session nice: {nice_changes(sampler.samples, t0)}")
                for a, b in c.probe_spans:
                    if (b - a) * 1e3 >= args.slow:
                        print(f" probe at {a - t0:.2f} s waited {(b - a) * 1e3:.0f} ms:")
                        print("\n".join(explain(names, sampler.samples, a, b)))
        if px:
            k.cell(IPP_STOP)
    except BaseException:
        if px:
            k.cell(IPP_CLEANUP)
        raise
    finally:
        k.close()


if __name__ == "__main__":
    main()
