"""What a notebook user waits for: `%%distrun` against the alternatives, in real Jupyter kernels.

    .venv/bin/python benchmarks/notebook.py [--parts dispatch,output,cold,start] [--sizes 4,8]
        [--lines 1500,15000] [--output-sizes 4,8] [--total 100000] [--output-framework mpi] [--repeat 20] [--cold-repeat 2] [--start-sizes 4] [--phases]

Every figure is a cell sent through `jupyter_client` and timed until the kernel is idle and its last
iopub message (stream, display, widget comm) has arrived (`nbkernel.py`), beside the alternative in
the same run, in alternating order. The ipyparallel alternative is an MPI cluster of the same size
(`ipp.Cluster(engines="mpi")`, the venv's `mpiexec`) in the same kernel.

- dispatch: a warm `x = 1` under `%%distrun -f pytorch -N 1 -n N` and `%%px --block` (`--sizes`;
  `--dispatch-framework mpi`: no torch on the ranks, so that 32 ranks, 64 engines with ipyparallel's, fit);
- output: N ranks (`--output-sizes`, 4) each printing L lines (`--lines`, and `--total` spread over the ranks)
  and `%%px --block --stream`; while each burst runs, a short cell on a kernel subshell every 0.2 s (how
  responsive the notebook stays); `--output-framework mpi` for light engines at 16-32 ranks;
- cold: a fresh kernel to the first all-reduce result (4 ranks) and `torchrun --nproc_per_node 4` cold;
- start: engines started and a first `x = 1` (`%dist stop` before each; `-f pytorch`, whose set-up
  imports torch on every rank, and `-f mpi`) and ipyparallel's own MPI cluster started and a first
  `x = 1` (`--start-sizes`);
- `--phases`: where the time of a warm and a cold `%%distrun` cell goes, timed in the kernel.

Prints medians and ratios (`%%distrun` / the alternative); asserts nothing. `benchmarks/dispatch.py`
drives a terminal IPython (no kernel, no iopub, no widgets): a lower bound for dispatch only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial

from nbkernel import Cell, Kernel, alternate, kernel_env, probe_text
from phases import CLEAR, INSTALL, TAKE, table

from jupyter_dist.common.ports import free_ports

ALLREDUCE = ("import torch, torch.distributed as dist\n"
             "dist.init_process_group('gloo', init_method='env://')\n"
             "t = torch.ones(1); dist.all_reduce(t); print('sum', int(t.item()))")
SCRIPT = ALLREDUCE.replace(", init_method='env://'", "") + "\ndist.destroy_process_group()\n"
# the kernel's tracked objects and one full garbage collection's time (what a gen-2 collection during a burst holds the GIL)
GC_TIME = ("import gc as _gc, time as _time\n_t = _time.perf_counter(); _gc.collect()\n"
           "_gc_cost = (len(_gc.get_objects()), round((_time.perf_counter() - _t) * 1e3, 1))")
BURST = "for i in range({n}):\n    print('line', i, 'of the burst, some text to make it a real line')"


def ipp_start_code(n: int) -> str:
    """Cell code: an ipyparallel MPI cluster of n engines, `%%px_ipp` on all of them."""
    return (f"import ipyparallel as ipp\n"
            f"_ipc = ipp.Cluster(engines='mpi', n={n}, log_level=40, engine_timeout=900)\n"
            f"_rc = _ipc.start_and_connect_sync()\n"
            f"_rc.wait_for_engines({n}, timeout=900)\n"
            f"_rc[:].activate('_ipp')\n")


IPP_STOP = "_rc.close(); _ipc.stop_cluster_sync()"
# after a failed round: the ipyparallel cluster stopped whatever exists (its engines outlive the kernel)
IPP_CLEANUP = "\n".join(f"try:\n    {stop}\nexcept Exception:\n    pass" for stop in IPP_STOP.split("; "))


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def say(text: str) -> None:
    print(text, flush=True)


def dispatch(n: int, repeat: int, phases: bool, framework: str = "pytorch") -> None:
    k = Kernel()
    try:
        k.cell("%load_ext jupyter_dist").check()
        if phases:
            k.cell(INSTALL).check()
        dist = f"%%distrun -f {framework} -N 1 -n {n}\nx = 1"
        px = "%%px_ipp --block\nx = 1"
        d_start = k.cell(dist).check().seconds
        p_start = k.cell(ipp_start_code(n)).check().seconds
        say(f"  {n} ranks up: %%distrun's engines + first cell {d_start:.1f} s, ipyparallel cluster {p_start:.1f} s")
        for _ in range(3):  # warm both paths
            k.cell(dist).check(), k.cell(px).check()
        if phases:
            k.cell(CLEAR)
        got: dict[str, list[Cell]] = {"d": [], "p": []}
        d, p = alternate(partial(run_into, k, dist, got["d"]), partial(run_into, k, px, got["p"]), repeat)
        warm = k.value(TAKE) if phases else {}
        md, mp = med(d), med(p)
        say(f"dispatch, warm `x = 1`, {n} ranks, median of {repeat}: %%distrun -f {framework} {md * 1e3:.1f} ms, "
            f"%%px --block {mp * 1e3:.1f} ms, ratio {md / mp:.2f}; iopub messages of a cell "
            f"{sorted(got['d'][-1].counts.items())} / {sorted(got['p'][-1].counts.items())}")
        if phases:
            say(table([{key: v / repeat for key, v in warm.items()}],
                      f"  phases of a warm cell, {n} ranks (mean of {repeat}):"))
        k.cell(IPP_STOP)
    except BaseException:
        k.cell(IPP_CLEANUP)
        raise
    finally:
        k.close()


def output(lines: list[int], repeat: int, phases: bool, ranks: int = 4, framework: str = "pytorch") -> None:
    """`lines`: per rank. Both paths are probed: a short cell on a kernel subshell every 0.2 s."""
    k = Kernel()
    try:
        k.cell("%load_ext jupyter_dist" + (INSTALL if phases else "")).check()
        flags = f"-f {framework} -N 1 -n {ranks}"
        k.cell(f"%%distrun {flags}\nx = 1").check()
        k.cell(ipp_start_code(ranks)).check()
        sub = k.subshell()
        for n in lines:
            if phases:
                k.cell(CLEAR)
            got: dict[str, list[Cell]] = {"d": [], "p": []}
            d, p = alternate(partial(run_into, k, f"%%distrun {flags}\n" + BURST.format(n=n), got["d"], sub),
                             partial(run_into, k, "%%px_ipp --block --stream\n" + BURST.format(n=n), got["p"], sub),
                             repeat)
            cd, cp = got["d"][-1], got["p"][-1]
            say(f"output, {ranks} ranks x {n:,} lines ({ranks * n:,} in all), median of {repeat}: %%distrun {flags} "
                f"{med(d):.2f} s, %%px --block --stream {med(p):.2f} s, ratio {med(d) / med(p):.2f} "
                f"(iopub: {sum(cd.counts.values())} / {sum(cp.counts.values())} messages, "
                f"{cd.bytes / 1e6:.1f} / {cp.bytes / 1e6:.1f} MB, lines shown {cd.lines} / {cp.lines}; "
                f"messages under a probe's parent {cd.misparented} / {cp.misparented})")
            say(f"  a subshell's `1` during the burst: %%distrun {probe_text([t for c in got['d'] for t in c.probes])}; "
                f"%%px {probe_text([t for c in got['p'] for t in c.probes])}")
            if phases:
                burst = k.value(TAKE)
                say(table([{key: v / repeat for key, v in burst.items()}],
                          f"  phases of a {n:,}-line burst's cell (mean of {repeat}):"))
        k.cell(GC_TIME).check()
        objects, ms = k.value("_gc_cost")
        say(f"  the kernel after the bursts: {objects} objects tracked, a full collection {ms} ms")
        k.cell(IPP_STOP)
    finally:
        k.close()


def cold(repeat: int, phases: bool, background: bool = False) -> None:
    """`background`: the kernel loads the extension with DistSettings.background_start on, and the cell
    is sent as soon as `%load_ext` returns (no time to read the line: the least the start can gain)."""
    env = {k: v for k, v in kernel_env().items() if not k.startswith("JUPYTER_DIST_") or k == "JUPYTER_DIST_DIR"}
    kenv = {**env, "JUPYTER_DIST_BACKGROUND_START": "1" if background else "0"}
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "allreduce.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        parts: list[tuple[float, float, float]] = []
        runs: list[dict[str, float]] = []

        def notebook() -> float:
            t0 = time.perf_counter()
            k = Kernel(kenv)
            try:
                # the panel's layout set to the cell's (4 ranks; its default here is 2, which the cell would restart)
                panel = "from jupyter_dist.plan.defaults import STORE; STORE.update(procs_per_node=4)\n"
                load = k.cell((panel if background else "") + "%load_ext jupyter_dist"
                              + (INSTALL if phases else "")).check().seconds
                c = k.cell("%%distrun -f pytorch -N 1 -n 4\n" + ALLREDUCE).check()
                total = time.perf_counter() - t0
                parts.append((k.started, load, c.seconds))
                if phases:
                    runs.append(k.value(TAKE))
                k.cell("import jupyter_dist; jupyter_dist.get_session().shutdown()")
            finally:
                k.close()
            return total

        def torchrun() -> float:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4",
                   "--master_port", str(free_ports(1)[0]), script]
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=600)
            return time.perf_counter() - t0

        d, t = alternate(notebook, torchrun, repeat)
    ks, ls, cs = (med(list(x)) for x in zip(*parts, strict=True))
    how = "background start at %load_ext" if background else "no background start"
    say(f"cold ({how}), fresh kernel to the first all-reduce result, 4 ranks, median of {repeat}: {med(d):.2f} s "
        f"(kernel {ks:.2f} s, %load_ext {ls:.2f} s, first cell {cs:.2f} s); torchrun --nproc_per_node 4 cold "
        f"{med(t):.2f} s; ratio {med(d) / med(t):.2f}")
    if phases:
        say(table(runs, "  phases of the first cell (median):"))


def run_into(k: Kernel, cell: str, into: list[Cell], probe: str | None = None) -> float:
    c = k.cell(cell, probe=probe).check()
    into.append(c)
    return c.seconds


def start(n: int, repeat: int, framework: str, phases: bool = False) -> None:
    """`-f pytorch` imports torch on every rank at set-up (its hooks); `-f mpi` starts engines alone."""
    k = Kernel()
    dist_cell = f"%%distrun -f {framework} -N 1 -n {n}\nx = 1"
    runs: list[dict[str, float]] = []
    try:
        k.cell("%load_ext jupyter_dist" + (INSTALL if phases else "")).check()
        k.cell(ipp_start_code(n) + IPP_STOP).check()  # imports on both paths before timing
        k.cell(dist_cell).check()

        def dist() -> float:
            k.cell("%dist stop").check()
            if phases:
                k.cell(CLEAR).check()
            took = k.cell(dist_cell).check().seconds
            if phases:
                runs.append(k.value(TAKE))
            return took

        def ipp() -> float:
            c = k.cell(ipp_start_code(n) + "_rc[:].execute('x = 1', block=True)").check()
            k.cell(IPP_STOP).check()
            return c.seconds

        d, p = alternate(dist, ipp, repeat)
        say(f"start, {n} engines and a first `x = 1`, median of {repeat}: %%distrun -f {framework} {med(d):.2f} s, "
            f"ipyparallel MPI cluster {med(p):.2f} s, ratio {med(d) / med(p):.2f}")
        if phases:
            say(table(runs, f"  phases of the %%distrun -f {framework} cell at {n} ranks (median):"))
    finally:
        k.close()


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="dispatch,output,cold,start")
    ap.add_argument("--sizes", type=ints, default=[4, 8], help="world sizes of `dispatch` (the issue's: 4,8,16,32)")
    ap.add_argument("--lines", type=ints, default=[1500, 15000], help="lines per rank of `output` (more: 25000)")
    ap.add_argument("--output-sizes", type=ints, default=[4], help="world sizes of `output` (the issue's: 4-32)")
    ap.add_argument("--total", type=ints, default=[], help="also, for `output`: these many lines in all, spread "
                    "over the ranks (100000: 12,500 a rank at 8 ranks)")
    ap.add_argument("--output-framework", default="pytorch", help="-f of `output` (mpi: light engines, no torch; "
                    "32 ranks of both clusters are 64 engines)")
    ap.add_argument("--start-sizes", type=ints, default=[4], help="world sizes of `start` (the issue's: 32)")
    ap.add_argument("--start-frameworks", default="pytorch,mpi", help="-f of `start` (pytorch imports torch per rank)")
    ap.add_argument("--repeat", type=int, default=20, help="rounds of `dispatch`")
    ap.add_argument("--dispatch-framework", default="pytorch",
                    help="-f of `dispatch` (mpi: no torch on the ranks; 32 ranks on 2 cores)")
    ap.add_argument("--output-repeat", type=int, default=2)
    ap.add_argument("--cold-repeat", type=int, default=2, help="rounds of `cold` and `start`")
    ap.add_argument("--phases", action="store_true", help="time the phases of a %%distrun cell in the kernel")
    ap.add_argument("--cold-background", default="off", choices=("off", "on", "both"),
                    help="`cold` with DistSettings.background_start (the panel's layout: 4 ranks here)")
    args = ap.parse_args()
    parts = args.parts.split(",")
    say(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M')}")
    if "dispatch" in parts:
        for n in args.sizes:
            dispatch(n, args.repeat, args.phases, args.dispatch_framework)
    if "output" in parts:
        for n in args.output_sizes:
            output([*args.lines, *(t // n for t in args.total)], args.output_repeat, args.phases, n,
                   args.output_framework)
    if "cold" in parts:
        for bg in {"off": (False,), "on": (True,), "both": (False, True)}[args.cold_background]:
            cold(args.cold_repeat, args.phases, bg)
    if "start" in parts:
        for n in args.start_sizes:
            for fw in args.start_frameworks.split(","):
                start(n, args.cold_repeat, fw, args.phases)
    say(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
