"""Where a warm trivial cell's time goes: `%%distrun` against `%%px --block` on the same engines.

    .venv/bin/python benchmarks/dispatch_phases.py [--repeat 300]

Each cell is cut at three points, taken around ipyparallel's `DirectView.execute` (wrapped here)
and by a done-callback on its result: before the send (flags, checks, environments), the send,
the wait until every rank's reply is in, and after it (output wait, drain, bookkeeping, return).
Medians in milliseconds, rounds alternating. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import redirect_stdout
from io import StringIO

PHASES = ("before send", "send", "wait", "after", "total")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=300)
    args = ap.parse_args()

    import ipyparallel.client.view as ipp_view
    from IPython.testing.globalipapp import start_ipython

    import jupyter_dist

    ip = start_ipython()
    ip.run_line_magic("load_ext", "jupyter_dist")
    quiet = StringIO()
    cell = "x = 1"

    def distrun() -> None:
        with redirect_stdout(quiet):
            ip.run_cell_magic("distrun", "-f pytorch -N 2 -n 2", cell)

    distrun()  # starts the engines
    session = jupyter_dist.get_session()
    view = session.cluster.client[[e.engine_id for e in session.cluster.engines]]
    view.activate("_phases")

    def px() -> None:
        with redirect_stdout(quiet):
            ip.run_cell_magic("px_phases", "--block", cell)

    marks: dict[str, float] = {}
    execute = ipp_view.DirectView.execute

    def timed_execute(self, *a, **k):  # noqa: ANN001, ANN202 - a stand-in with execute's signature
        marks["sent0"] = time.perf_counter()
        ar = execute(self, *a, **k)
        marks["sent1"] = time.perf_counter()
        ar.add_done_callback(lambda _f: marks.setdefault("ready", time.perf_counter()))
        return ar

    ipp_view.DirectView.execute = timed_execute

    def one(fn) -> tuple[float, ...]:  # noqa: ANN001
        marks.clear()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        return (marks["sent0"] - t0, marks["sent1"] - marks["sent0"], marks["ready"] - marks["sent1"],
                t1 - marks["ready"], t1 - t0)

    for _ in range(20):
        one(distrun), one(px)
    rows: dict[str, list[tuple[float, ...]]] = {"%%distrun": [], "%%px --block": []}
    for i in range(args.repeat):
        order = (("%%distrun", distrun), ("%%px --block", px))
        for name, fn in order if i % 2 == 0 else order[::-1]:
            rows[name].append(one(fn))
    print(f"warm 4 ranks (2 x 2), trivial cell, median of {args.repeat}, ms:")
    print(f"{'':14}" + "".join(f"{p:>13}" for p in PHASES))
    for name, got in rows.items():
        print(f"{name:14}" + "".join(f"{statistics.median(col) * 1e3:>13.3f}" for col in zip(*got, strict=True)))
    session.shutdown()


if __name__ == "__main__":
    main()
