"""The cost of one `jupyter_dist.report()` call, flushes included.

    python benchmarks/report_cost.py            # in this process (the batch JSON-encoded, as sent)
    python benchmarks/report_cost.py --engine   # also on a real engine of a 1-rank %%distrun

Prints microseconds per call, next to an empty function with the same signature (the floor of
any Python call on this machine at this moment). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ENGINE_CELL = """
import time, jupyter_dist
def _empty(step=None, samples=None, tokens=None, **scalars): pass
def per_call(fn, n):
    t = time.perf_counter()
    for i in range(n): fn(step=i, samples=32, loss=0.5)
    return (time.perf_counter() - t) / n * 1e6
best = {{"report": 1e9, "empty": 1e9}}
for _ in range({repeats}):   # best of: the engine shares the cores with its IO threads and the notebook
    best["empty"] = min(best["empty"], per_call(_empty, {n}))
    best["report"] = min(best["report"], per_call(jupyter_dist.report, {n}))
cost = (best["report"], best["empty"])
"""


def _empty(step=None, samples=None, tokens=None, **scalars):  # noqa: ANN001, ANN202 - the same signature
    pass


def per_call_us(fn, n: int) -> float:  # noqa: ANN001
    t = time.perf_counter()
    for i in range(n):
        fn(step=i, samples=32, loss=0.5)
    return (time.perf_counter() - t) / n * 1e6


def in_process(n: int, repeats: int) -> tuple[float, float, int]:
    from jupyter_dist.engine import metrics
    sent: list[int] = []
    metrics._state["sender"] = lambda payload: sent.append(len(json.dumps(payload)))  # what publish serialises
    metrics._state["watching"] = True
    best_report = best_empty = float("inf")
    for _ in range(repeats):
        best_empty = min(best_empty, per_call_us(_empty, n))
        best_report = min(best_report, per_call_us(metrics.report, n))
    metrics.flush()
    return best_report, best_empty, len(sent)


def on_engine(n: int, repeats: int) -> tuple[float, float]:
    from IPython.testing.globalipapp import start_ipython

    import jupyter_dist

    os.environ.setdefault("JUPYTER_DIST_DIR", os.path.join(os.path.dirname(__file__), "..", "test-artifacts", "state"))
    ip = start_ipython()
    jupyter_dist.load_ipython_extension(ip)
    try:
        ip.run_cell_magic("distrun", "-f pytorch -N 1 -n 1 -o cost", ENGINE_CELL.format(n=n, repeats=repeats))
        return ip.user_ns["cost"][0]
    finally:
        jupyter_dist.get_session().shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=300_000, help="calls per measurement")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--engine", action="store_true", help="also measure on a real engine")
    args = ap.parse_args()
    report_us, empty_us, flushes = in_process(args.n, args.repeats)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"python {sys.version.split()[0]}, load average {load:.1f} on {os.cpu_count()} cores")
    print(f"in process: report() {report_us:.2f} us/call (best of {args.repeats} x {args.n:,}; "
          f"{flushes} flushes, JSON-encoded), empty call {empty_us:.2f} us, report() above it {report_us - empty_us:.2f} us")
    budget = f"in process {report_us / 10:.2f}"
    if args.engine:
        rep, emp = on_engine(args.n, args.repeats)
        print(f"on an engine: report() {rep:.2f} us/call (best of {args.repeats} x {args.n:,}, sent by "
              f"engine.publish), empty call {emp:.2f} us, above it {rep - emp:.2f} us")
        budget += f", on an engine {rep / 10:.2f}"
    print(f"ratio to the 10 us budget: {budget}")


if __name__ == "__main__":
    main()
