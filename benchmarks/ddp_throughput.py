"""DDP training throughput: `%distrun` in a real kernel (live views and metrics on) against the same
script under torchrun, in the same run.

    .venv/bin/python benchmarks/ddp_throughput.py [--nproc 4] [--steps 1000] [--repeats 6] [--ab] [--observe]
        [--busy K]

The script (written to a temporary directory) trains a small MLP with DDP over gloo, calls
`jupyter_dist.report(step, samples, loss)` every step, and prints its own samples/s measured
between barriers after a warm-up. Under jupyter-dist it runs as `%distrun -f pytorch -N 1 -n P
train.py` in a kernel started with jupyter_client, so the live widget, the chart and the
metrics are all on; under torchrun as `python -m torch.distributed.run --nproc_per_node P
train.py`. Runs alternate, in an order rotated each round; the figure is the median over rounds of
each round's ratio (its two runs were seconds apart, so a machine's drift falls on both alike),
with the ratio of the medians and of the bests beside it.
Prints the ratio (goal >= 0.98) and each variant's CPU time per step of a rank (process, main
thread): the same CPU at a lower rate means the ranks waited for a core. Asserts nothing.
`--observe` measures the cost of seeing every rank instead (see `observe`; benchmarks/README.md).
`--busy K` keeps K processes spinning for the whole measurement. Each run's ranks also report every
thread's CPU and wakeups per second over the measured window (`/proc/self/task`), printed per variant.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from jupyter_dist.common.ports import free_ports

TRAIN = textwrap.dedent(
    """
    import json, os, sys, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import jupyter_dist

    def threads():  # each thread: name/tid -> (CPU ns, voluntary switches: times it slept and was woken, ns runnable
        # but waiting for a core: schedstat's second field)
        got = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    stat = f.read()
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    run_ns, wait_ns = (int(v) for v in f.read().split()[:2])
                with open(f"/proc/self/task/{tid}/status") as f:
                    woke = int(next(x for x in f if x.startswith("voluntary_ctxt")).split()[1])
            except (OSError, StopIteration):
                continue
            name = "main" if int(tid) == os.getpid() else stat[stat.index("(") + 1:stat.rindex(")")]
            got[f"{name}/{tid}"] = (run_ns, woke, wait_ns)
        return got

    steps, warmup, batch, width = (int(a) for a in sys.argv[1:5])
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                    torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(batch, width, generator=gen), torch.randn(batch, 1, generator=gen)
    for i in range(warmup + steps):
        if i == warmup:
            dist.barrier()
            t0 = time.perf_counter()
            c0, m0 = time.process_time(), time.thread_time()  # CPU of the process, of this thread
            th0 = threads()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        jupyter_dist.report(step=i, samples=batch, loss=float(loss))
    dist.barrier()
    elapsed = time.perf_counter() - t0
    cpu, main = (time.process_time() - c0) / steps * 1e3, (time.thread_time() - m0) / steps * 1e3
    th1 = threads()
    per = {}  # thread name -> [CPU ms per s, wakeups per s, ms per s waiting for a core], threads of one name summed
    for key, (ns, woke, wait) in th1.items():
        ns0, woke0, wait0 = th0.get(key, (0, 0, 0))
        acc = per.setdefault(key.split("/")[0], [0.0, 0.0, 0.0])
        acc[0] += (ns - ns0) / 1e6 / elapsed
        acc[1] += (woke - woke0) / elapsed
        acc[2] += (wait - wait0) / 1e6 / elapsed
    print(f"RATE {rank} {steps * batch / elapsed:.3f} {cpu:.3f} {main:.3f}", flush=True)
    print("THREADS", rank, json.dumps(per), flush=True)
    """
)
TEXT_SINK = ("import jupyter_dist; from jupyter_dist.views.live_output import text_sink; "
             "jupyter_dist.get_session().runner.sink_factory = text_sink")
LIVE_SINK = ("import jupyter_dist; from jupyter_dist.views.live_output import default_sink; "
             "jupyter_dist.get_session().runner.sink_factory = default_sink")
RATE = re.compile(r"RATE (\d+) ([0-9.]+) ([0-9.]+) ([0-9.]+)")
THREADS = re.compile(r"THREADS \d+ (\{.*\})")
SESSION_SWITCH = "JUPYTER_DIST_OWN_SESSION"  # engine/sessions.py: "0" leaves the engines in the kernel's session
SWITCH = "JUPYTER_DIST_OBSERVE"  # engine/resources.py: "0" turns the sampling and the collective records off
OBSERVE = ("import os, jupyter_dist; from jupyter_dist.views.live_output import default_sink; "
           "jupyter_dist.get_session().runner.sink_factory = default_sink; os.environ['" + SWITCH + "'] = '{on}'")
COST = ("import json, jupyter_dist; from jupyter_dist.run import resources as _r; "
        "_a = jupyter_dist.get_session().cluster.agents; "
        "_x = _a.ask('resources', sorted(_a.addresses), {'since': 9e18}, timeout=5); "
        "import time as _t; print('COST', json.dumps({'ranks': {r: v['cost'] for r, v in _x.results.items()}, "
        "'poll': _r._LOOP.cpu_s, 'kernel': _t.process_time()}))")


def parse(text: str, nproc: int) -> tuple[float, float, float]:
    """(samples/s summed over ranks, CPU ms per step of a rank's process, of its main thread: rank means)."""
    found = {int(r): (float(v), float(c), float(m)) for r, v, c, m in RATE.findall(text)}
    if len(found) != nproc:
        raise RuntimeError(f"expected {nproc} RATE lines, got {len(found)}:\n{text[-3000:]}")
    vals = list(found.values())
    return sum(v[0] for v in vals), statistics.fmean(v[1] for v in vals), statistics.fmean(v[2] for v in vals)


def threads_of(text: str) -> dict[str, tuple[float, ...]]:
    """Thread name -> (CPU ms per s, wakeups per s, ms per s waiting for a core) of a rank's process, mean over the
    ranks' THREADS lines."""
    ranks = [json.loads(j) for j in THREADS.findall(text)]
    names = {n for r in ranks for n in r}
    return {n: tuple(statistics.fmean(r.get(n, [0, 0, 0])[i] for r in ranks) for i in range(3)) for n in names}


def print_threads(per_kind: dict[str, list[dict[str, tuple[float, ...]]]]) -> None:
    """Each thread name's CPU, wakeups and wait for a core per second in a rank (median over the runs), per variant."""
    kinds = [k for k, runs in per_kind.items() if runs]
    names = sorted({n for k in kinds for run in per_kind[k] for n in run},
                   key=lambda n: -max(statistics.median(r.get(n, (0, 0))[0] for r in per_kind[k]) for k in kinds))
    print("threads of a rank's process: CPU ms/s, wakeups/s, waiting for a core ms/s (median of runs; "
          + " | ".join(kinds) + ")")
    for n in names:
        cols = [tuple(statistics.median(r.get(n, (0, 0, 0))[i] for r in per_kind[k]) for i in range(3)) for k in kinds]
        print(f"  {n:18s} " + " | ".join(f"{c:6.1f} ms/s {w:6.1f}/s {q:6.1f} ms/s" for c, w, q in cols))


def start_busy(k: int) -> list[subprocess.Popen]:
    """K processes that spin for the whole measurement (the issue's "two more busy processes"), each in a
    session of its own, as another user's process is: the scheduler shares CPU between sessions first
    (autogroups), and spinners in this script's session would take their CPU from torchrun's workers
    only (torchrun runs in this session; the kernel and its engines in another)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(k)]


def run_torchrun(script: Path, args: list[str], nproc: int) -> tuple[float, float, float, dict]:
    """torchrun from this script's session; its agent starts each worker in a session of its own
    (`start_new_session=True`), as jupyter-dist's engines put themselves (engine/sessions.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_DIST_")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--master_port", str(free_ports(1)[0]), str(script), *args]  # a fixed port can still be held
    for attempt in (1, 2):
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if out.returncode == 0 or len(RATE.findall(out.stdout)) == nproc:
            break
        # torch 2.13's gloo workers now and then abort at exit ("terminate called without an
        # active exception") after the measured window; such a run is run again, once
        print(f"  torchrun failed ({out.returncode}), attempt {attempt}: {out.stderr.strip().splitlines()[:1]}",
              flush=True)
    else:
        raise RuntimeError(f"torchrun failed twice ({out.returncode}):\n{out.stderr[-3000:]}")
    return (*parse(out.stdout, nproc), threads_of(out.stdout))


def cost_of(text: str) -> tuple[dict[int, tuple[float, float]], float, float]:
    """(rank -> (sampler CPU s, engine wall s), the kernel's polling CPU s, the kernel's CPU s) from COST's line."""
    got = json.loads(text[text.index("COST ") + 5:].splitlines()[0])
    return ({int(r): (c["cpu_s"], c["wall_s"]) for r, c in got["ranks"].items()}, float(got["poll"]),
            float(got["kernel"]))


def recorder_cost(calls: int = 20000, blocks: int = 9) -> tuple[float, float]:
    """The collectives recorder's own cost per call (µs): engine/collectives.py's wrapper around a call
    that does nothing, against that call bare, in interleaved blocks (thread CPU time, median); and a real
    gloo all_reduce of 4 floats in a group of one (µs), for scale."""
    import torch  # the benchmark's own process: only for this measurement
    import torch.distributed as dist

    from jupyter_dist.engine import collectives

    def bare(*args: object, **kwargs: object) -> None:
        return None

    wrapped = collectives._recorded("all_reduce", bare)
    t = torch.ones(4)
    per: dict[str, list[float]] = {"bare": [], "wrapped": []}
    for _ in range(blocks):
        for name, fn in (("bare", bare), ("wrapped", wrapped)):
            c0 = time.thread_time()
            for _ in range(calls):
                fn(t)
            per[name].append((time.thread_time() - c0) / calls * 1e6)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(str(Path(tmp) / "s"), 1), rank=0, world_size=1)
        c0 = time.thread_time()
        for _ in range(2000):
            dist.all_reduce(t)
        real = (time.thread_time() - c0) / 2000 * 1e6
        dist.destroy_process_group()
    return statistics.median(per["wrapped"]) - statistics.median(per["bare"]), real


class Kernel:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        from jupyter_client.manager import start_new_kernel

        self.km, self.kc = start_new_kernel(kernel_name="python3", env={**os.environ, **(env or {})})

    def run(self, code: str, timeout: float = 600) -> str:
        msg_id = self.kc.execute(code)
        out: list[str] = []
        while True:
            msg = self.kc.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind == "error":
                raise RuntimeError("\n".join(content["traceback"]))
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(out)

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--ab", action="store_true",
                    help="also run %%distrun with the plain text sink (no live widget, no live chart)")
    ap.add_argument("--observe", action="store_true",
                    help=f"instead of torchrun: %%distrun with {SWITCH}=0 (no resource sampling, no collective "
                         "records) against the same with them on, and their CPU cost")
    ap.add_argument("--busy", type=int, default=0, help="K processes spinning on the machine for the whole run")
    ap.add_argument("--ab-sessions", action="store_true",
                    help="also run %%distrun in a second kernel whose engines stay in the kernel's session "
                         f"({SESSION_SWITCH}=0: engine/sessions.py)")
    ap.add_argument("--alt-env", action="append", default=[], metavar="K=V",
                    help="also run %%distrun in a second kernel started with this environment (repeatable)")
    ap.add_argument("--alt-flags", default="", help="... and with these %%distrun flags added (e.g. '--launcher local')")
    args = ap.parse_args()
    if args.ab_sessions:
        args.alt_env.append(f"{SESSION_SWITCH}=0")
    busy = start_busy(args.busy)
    try:
        observe(args) if args.observe else compare(args)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()


def compare(args: argparse.Namespace) -> None:
    """%distrun against torchrun, paired rounds."""
    os.environ.setdefault("JUPYTER_DIST_DIR", str(Path(__file__).resolve().parent.parent / "test-artifacts" / "state"))
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(TRAIN)
        targs = [str(args.steps), str(args.warmup), str(args.batch), str(args.width)]
        kernel = Kernel()
        shared: Kernel | None = None
        try:
            kernel.run("%load_ext jupyter_dist")
            line = f"%distrun -f pytorch -N 1 -n {args.nproc} {script} {' '.join(targs)}"
            print("warm-up run (starts the engines)", flush=True)
            kernel.run(line)  # starts the engines and imports torch there: not measured
            alt = bool(args.alt_env or args.alt_flags)
            # flags of the second kernel's runs, e.g. `-f torchrun` (in place of `-f pytorch`) or `--launcher local`
            alt_line = line.replace("-f pytorch", "") if re.search(r"(^| )(-f|--framework)[ =]", args.alt_flags) else line
            alt_line = alt_line.replace("%distrun ", f"%distrun {args.alt_flags} ", 1) if args.alt_flags else alt_line
            if alt:  # e.g. engines left in their kernel's session (--ab-sessions): the arrangement before engine/sessions.py
                shared = Kernel(dict(kv.split("=", 1) for kv in args.alt_env))
                shared.run("%load_ext jupyter_dist")
                shared.run(alt_line)
            rates: dict[str, list[float]] = {"torchrun": [], "shared": [], "live": [], "text": []}
            cpu: dict[str, list[tuple[float, float]]] = {k: [] for k in rates}
            per_thread: dict[str, list[dict[str, tuple[float, ...]]]] = {k: [] for k in rates}
            loads: list[float] = []
            kinds = ["torchrun", "live", "text"] if args.ab else ["torchrun", "live"]
            kinds += ["shared"] if alt else []
            out = ""
            for i in range(args.repeats):
                order = kinds[i % len(kinds):] + kinds[:i % len(kinds)]  # rotated: no variant always first
                print(f"round {i + 1}/{args.repeats}: {', '.join(order)}", flush=True)
                for kind in order:
                    loads.append(os.getloadavg()[0])
                    if kind == "torchrun":
                        rate, c, m, th = run_torchrun(script, targs, args.nproc)
                    else:
                        k = shared if kind == "shared" and shared else kernel
                        k.run(TEXT_SINK if kind == "text" else LIVE_SINK)
                        text = k.run(alt_line if kind == "shared" else line)
                        rate, c, m = parse(text, args.nproc)
                        th = threads_of(text)
                        if kind == "live":
                            out = text
                    rates[kind].append(rate)
                    cpu[kind].append((c, m))
                    per_thread[kind].append(th)
            summary = out[out.find("jupyter-dist: run summary"):].splitlines()[:1]
            dist_rates, torchrun_rates, text_rates, k_rates = rates["live"], rates["torchrun"], rates["text"], rates["shared"]
        finally:
            kernel.close()
            if shared:
                shared.close()
    best_d, best_t = max(dist_rates), max(torchrun_rates)
    print(f"DDP {args.nproc} ranks, MLP width {args.width}, batch {args.batch}, {args.steps} steps, "
          f"{os.cpu_count()} cores, {args.busy} busy processes, load average {min(loads):.1f}-{max(loads):.1f}")
    print(f"  torchrun:          {', '.join(f'{r:,.0f}' for r in torchrun_rates)} samples/s")
    print(f"  %distrun (views):  {', '.join(f'{r:,.0f}' for r in dist_rates)} samples/s")
    if text_rates:
        print(f"  %distrun (text):   {', '.join(f'{r:,.0f}' for r in text_rates)} samples/s")
    if k_rates:
        print(f"  %distrun, second kernel ({' '.join(args.alt_env)} {args.alt_flags}): {', '.join(f'{r:,.0f}' for r in k_rates)} samples/s")
    if summary:
        print(f"  its notebook summary: {summary[0]}")
    paired = [d / t for d, t in zip(dist_rates, torchrun_rates, strict=True)]
    print(f"ratio distrun/torchrun: median of the rounds' ratios {statistics.median(paired):.3f} "
          f"(rounds {', '.join(f'{r:.3f}' for r in paired)}; goal >= 0.98); "
          f"ratio of medians {statistics.median(dist_rates) / statistics.median(torchrun_rates):.3f}, "
          f"of bests {best_d / best_t:.3f}")
    if k_rates:
        own = [d / t for d, t in zip(dist_rates, k_rates, strict=True)]
        tk = [k / t for k, t in zip(k_rates, torchrun_rates, strict=True)]
        print(f"ratio first kernel/second kernel: median of the rounds' ratios {statistics.median(own):.3f} "
              f"(rounds {', '.join(f'{r:.3f}' for r in own)}); second kernel/torchrun: "
              f"{statistics.median(tk):.3f} (rounds {', '.join(f'{r:.3f}' for r in tk)})")
    if text_rates:
        print(f"ratio views on/off: median {statistics.median(dist_rates) / statistics.median(text_rates):.3f}; "
              f"text sink/torchrun: median {statistics.median(text_rates) / statistics.median(torchrun_rates):.3f}")
    # what each rank spent per step: the same CPU with a lower rate means waiting for a core, not our work
    for kind, label in (("torchrun", "torchrun"), ("shared", "%distrun (second kernel)"), ("live", "%distrun (views)"),
                        ("text", "%distrun (text)")):
        if cpu[kind]:
            c = statistics.median(x[0] for x in cpu[kind])
            m = statistics.median(x[1] for x in cpu[kind])
            print(f"CPU per step of a rank, {label}: process {c:.2f} ms, main thread {m:.2f} ms (median)")
    print_threads(per_thread)



def observe(args: argparse.Namespace) -> None:
    """The cost of seeing every rank: paired, interleaved rounds of %distrun with sampling and recording
    on and off (both with the live views), and the CPU time the sampler, the agents' answers and the
    kernel's polling took per second of training, measured in their own threads."""
    os.environ.setdefault("JUPYTER_DIST_DIR", str(Path(__file__).resolve().parent.parent / "test-artifacts" / "state"))
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(TRAIN)
        targs = f"{args.steps} {args.warmup} {args.batch} {args.width}"
        kernel = Kernel()
        rates: dict[str, list[float]] = {"on": [], "off": []}
        cpu: dict[str, list[float]] = {"on": [], "off": []}  # CPU ms per step of a rank's process (engine)
        kernel_cpu: dict[str, list[float]] = {"on": [], "off": []}  # the kernel's CPU s per s of a run
        sampler: list[float] = []  # a rank's sampler CPU s per wall s, each on-run
        polling: list[float] = []
        loads: list[float] = []
        try:
            kernel.run("%load_ext jupyter_dist")
            print("warm-up run (starts the engines)", flush=True)
            kernel.run(f"%distrun -f pytorch -N 1 -n {args.nproc} {script} {targs}")
            for i in range(args.repeats):
                order = ["on", "off"] if i % 2 == 0 else ["off", "on"]
                print(f"round {i + 1}/{args.repeats}: {', '.join(order)}", flush=True)
                for kind in order:
                    on = "1" if kind == "on" else "0"
                    kernel.run(OBSERVE.format(on=on))
                    loads.append(os.getloadavg()[0])
                    before = cost_of(kernel.run(COST))
                    t0 = time.monotonic()
                    text = kernel.run(f"%distrun -f pytorch -N 1 -n {args.nproc} --env {SWITCH}={on} {script} {targs}")
                    wall = time.monotonic() - t0
                    after = cost_of(kernel.run(COST))
                    rate, c, _ = parse(text, args.nproc)
                    rates[kind].append(rate)
                    cpu[kind].append(c)
                    kernel_cpu[kind].append((after[2] - before[2]) / wall)
                    if kind == "on":
                        sampler += [(after[0][r][0] - before[0][r][0]) / (after[0][r][1] - before[0][r][1])
                                    for r in after[0] if r in before[0]]
                        polling.append((after[1] - before[1]) / wall)
        finally:
            kernel.close()
    per_call, real = recorder_cost()
    paired = [a / b for a, b in zip(rates["on"], rates["off"], strict=True)]
    step_ms = statistics.median(args.nproc * args.batch / r for r in rates["on"]) * 1e3
    frac = statistics.median(sampler)
    print(f"DDP {args.nproc} ranks, MLP width {args.width}, batch {args.batch}, {args.steps} steps, "
          f"{os.cpu_count()} cores, load average {min(loads):.1f}-{max(loads):.1f}")
    print(f"  sampling on:  {', '.join(f'{r:,.0f}' for r in rates['on'])} samples/s")
    print(f"  sampling off: {', '.join(f'{r:,.0f}' for r in rates['off'])} samples/s")
    print(f"ratio on/off: median of the rounds' ratios {statistics.median(paired):.3f} "
          f"(rounds {', '.join(f'{r:.3f}' for r in paired)}; goal >= 0.99); ratio of medians "
          f"{statistics.median(rates['on']) / statistics.median(rates['off']):.3f}")
    print(f"CPU per step of a rank's process (the engine: its sampler and agent threads included), median: "
          f"on {statistics.median(cpu['on']):.3f} ms, off {statistics.median(cpu['off']):.3f} ms "
          f"(ratio {statistics.median(cpu['on']) / statistics.median(cpu['off']):.3f})")
    print(f"sampler + its answers, CPU per second on a rank's engine: {frac * 1e3:.3f} ms/s = {frac:.4%} of a core "
          f"(max {max(sampler) * 1e3:.3f} ms/s); {frac * step_ms * 1e3:.1f} µs per {step_ms:.2f} ms step")
    print(f"kernel's polling thread: {statistics.median(polling) * 1e3:.3f} ms CPU per second; the whole kernel "
          f"(live views, charts, output): on {statistics.median(kernel_cpu['on']) * 1e3:.1f} ms/s, "
          f"off {statistics.median(kernel_cpu['off']) * 1e3:.1f} ms/s (medians)")
    print(f"collectives recorder: {per_call:.2f} µs per collective call (a real gloo all_reduce of 4 floats, group of "
          f"one: {real:.1f} µs); DDP's all-reduces are C++ and not wrapped: 0 calls a step here, "
          f"{per_call / (step_ms * 1e3):.4%} of a step per collective a cell calls each step")


if __name__ == "__main__":
    main()
