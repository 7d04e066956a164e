"""Dispatch cost: `%%distrun` against `%%px --block` on the same warm engines, and cold launchers.

    .venv/bin/python benchmarks/dispatch.py [--repeat 30]

A LOWER BOUND: this drives a terminal IPython (`start_ipython`, output redirected), so no kernel, no
iopub and no widgets; what a notebook user waits for is `benchmarks/notebook.py` (real kernels).

Prints medians and ratios (distrun / alternative) measured in this one run; never asserts.
The cold alternatives (torchrun, Accelerate's notebook_launcher) start 4 processes per call, so
they are measured a few times only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import redirect_stdout
from io import StringIO

TRIVIAL = "x = 1"
ALLREDUCE = (
    "import torch, torch.distributed as dist\n"
    "dist.init_process_group('gloo', init_method='env://')\n"
    "t = torch.ones(1); dist.all_reduce(t)"
)
SCRIPT = (
    "import torch, torch.distributed as dist\n"
    "dist.init_process_group('gloo')\n"
    "t = torch.ones(1); dist.all_reduce(t)\n"
    "dist.destroy_process_group()\n"
)


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def paired_medians(fa, fb, repeat: int) -> tuple[float, float]:
    """Medians of `fa` and `fb` timed in alternating order, round by round, so that the load of a
    shared machine falls on both alike."""
    ta, tb = [], []
    for i in range(repeat):
        order = ((fa, ta), (fb, tb)) if i % 2 == 0 else ((fb, tb), (fa, ta))
        for fn, times in order:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--cold-repeat", type=int, default=3)
    args = ap.parse_args()

    from IPython.testing.globalipapp import start_ipython

    import jupyter_dist

    ip = start_ipython()
    ip.run_line_magic("load_ext", "jupyter_dist")
    quiet = StringIO()

    def distrun(cell: str) -> None:
        with redirect_stdout(quiet):
            ip.run_cell_magic("distrun", "-f pytorch -N 2 -n 2", cell)

    distrun(ALLREDUCE)  # start the cluster, make the group
    client = jupyter_dist.get_session().cluster.client
    ids = [e.engine_id for e in jupyter_dist.get_session().cluster.engines]
    view = client[ids]
    view.activate("_bench")

    def px(cell: str) -> None:
        with redirect_stdout(quiet):
            ip.run_cell_magic("px_bench", "--block", cell)

    results = {}
    for name, cell in (("trivial", TRIVIAL), ("allreduce", ALLREDUCE)):
        px(cell)
        distrun(cell)
        results[name] = paired_medians(lambda c=cell: distrun(c), lambda c=cell: px(c), args.repeat)

    print(f"warm 4-rank cluster (2 nodes x 2), median of {args.repeat}, alternating rounds:")
    print(f"{'cell':<10} {'%%distrun':>12} {'%%px --block':>14} {'ratio':>8}")
    for name, (d, p) in results.items():
        print(f"{name:<10} {d * 1e3:>10.2f}ms {p * 1e3:>12.2f}ms {d / p:>8.3f}")
    jupyter_dist.get_session().shutdown()

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "allreduce.py")
        with open(path, "w") as f:
            f.write(SCRIPT)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4", path]
        cold = median_time(lambda: subprocess.run(cmd, check=True, capture_output=True), args.cold_repeat)
    d = results["allreduce"][0]
    print(f"torchrun --nproc_per_node 4 (cold), median of {args.cold_repeat}: {cold * 1e3:.0f}ms; ratio {d / cold:.4f}")

    try:
        from accelerate import notebook_launcher
    except ImportError:
        print("accelerate not installed: notebook_launcher not measured")
        return
    cold = median_time(lambda: notebook_launcher(_accelerate_allreduce, num_processes=4), args.cold_repeat)
    print(f"accelerate notebook_launcher(4) (cold), median of {args.cold_repeat}: {cold * 1e3:.0f}ms; ratio {d / cold:.4f}")


def _accelerate_allreduce() -> None:
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)


if __name__ == "__main__":
    main()
