"""NCCL check on this machine's CUDA GPUs: one process per GPU, an all_reduce check, then the bench.

    python benchmarks/gpu_nccl_check.py [--iters 20] [--max-size BYTES] [--out DIR] [--cpu-ranks N]

Each process does what a `%%distrun` rank does: the rank environment plus the fabric
environment from `jupyter_dist.plan.fabric_env`, `torch.cuda.set_device(LOCAL_RANK)` *before*
`init_process_group("nccl")`, then `allreduce_bench`. Rank 0 prints what it saw: the node's
fabric, the doctor report, which GPU each process holds a context on (one per GPU is right),
the correctness check, the bandwidth table and the local copy ceiling. `--out` (default $OUT)
gets the rows as JSON and the chart as PNG. With no CUDA GPU it says so and exits 0, or, with
`--cpu-ranks N`, runs the same path over gloo on the CPU to try the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gpu_processes() -> str:
    """nvidia-smi's compute processes (pid, GPU, memory), to see that rank r sits on GPU r only."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return "(nvidia-smi not found)"
    query = ["--query-compute-apps=pid,gpu_bus_id,used_memory", "--format=csv,noheader"]
    try:
        res = subprocess.run([exe, *query], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as err:
        return f"(nvidia-smi failed: {err})"
    return res.stdout.strip() or res.stderr.strip() or "(none listed)"


def worker(
    local_rank: int, world: int, port: int, backend: str, env: dict[str, str], args: argparse.Namespace
) -> None:
    os.environ.update(env)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world),
        RANK=str(local_rank),
        LOCAL_RANK=str(local_rank),
        NODE_RANK="0",
        LOCAL_WORLD_SIZE=str(world),
    )
    import torch
    import torch.distributed as dist

    from jupyter_dist.engine.probes import DEFAULT_SIZES, allreduce_bench, local_copy_bandwidth
    from jupyter_dist.tools.bench_report import chart_png, format_table

    cuda = backend == "nccl"
    if cuda:
        torch.cuda.set_device(local_rank)  # before the group: NCCL binds the communicator to this GPU
    dist.init_process_group(backend, init_method="env://")
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    rank = dist.get_rank()

    # correctness: every rank contributes rank+1
    t = torch.full((1 << 20,), float(rank + 1), device=device)
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    wrong_device = int(cuda and torch.cuda.current_device() != local_rank)
    flags = torch.tensor([int((t != expected).sum().item()), wrong_device], device=device)
    dist.all_reduce(flags)
    bad, misplaced = int(flags[0]), int(flags[1])
    if rank == 0:
        print(
            f"all_reduce check: {world} ranks, expected {expected:g}: {bad} wrong elements, {misplaced} ranks off their GPU"
        )
    dist.barrier()
    if rank == 0 and cuda:
        print("GPU compute processes (pid, bus id, memory): one per GPU is right")
        print("  " + _gpu_processes().replace("\n", "\n  "))
    dist.barrier()

    sizes = [s for s in DEFAULT_SIZES if s <= args.max_size]
    start = time.perf_counter()
    rows = allreduce_bench(sizes, iters=args.iters, warmup=args.warmup)
    bench_s = time.perf_counter() - start
    copy = local_copy_bandwidth()
    if rank == 0:
        print(format_table(rows, world, backend))
        print(f"local copy ({device}, 64 MiB): {copy:.1f} GB/s; bench took {bench_s:.2f} s")
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            result = {"world_size": world, "backend": backend, "rows": rows, "local_copy_GBps": copy}
            result.update(bench_s=bench_s, check_wrong=bad, off_gpu=misplaced)
            (out / "gpu_nccl_check.json").write_text(json.dumps(result, indent=1))
            title = f"all_reduce, {world} ranks, {backend}"
            (out / "gpu_nccl_check.png").write_bytes(chart_png(rows, copy, title=title))
    dist.destroy_process_group()
    if bad or misplaced or any(r["wrong"] for r in rows):
        sys.exit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--max-size", type=int, default=64 << 20, help="largest message in bytes")
    parser.add_argument("--out", default=os.environ.get("OUT"), help="folder for the JSON rows and the chart")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before the ranks are killed")
    parser.add_argument("--cpu-ranks", type=int, default=0, help="with no GPU: run N gloo ranks on the CPU")
    args = parser.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("torch is not installed: nothing to check")
        return 0
    from jupyter_dist.engine.node_probe import detect_node
    from jupyter_dist.plan.fabric_env import fabric_env, resolve_backend
    from jupyter_dist.tools.doctor import build_report

    t0 = time.perf_counter()
    node = detect_node("127.0.0.1")
    took = time.perf_counter() - t0
    print(f"detect_node: {took:.2f} s; CUDA initialised by it: {torch.cuda.is_initialized()}")
    print(json.dumps(node.to_json(), indent=1))
    gpus = torch.cuda.device_count()
    n = gpus
    if gpus == 0:
        print(
            f"no CUDA GPU found (torch {torch.__version__}, CUDA build {torch.version.cuda}): nothing to check"
        )
        if args.cpu_ranks <= 0:
            return 0
        n = args.cpu_ranks
    backend, why = resolve_backend("auto", gpus, n)
    kw = dict(master_addr="127.0.0.1", backend="auto", ib="auto", kernel_env=dict(os.environ))
    print(build_report([node], procs_per_node=n, nodes_requested=1, **kw).to_text())
    env = fabric_env(
        node, backend=backend, ib="auto", nccl_debug=False, master_addr="127.0.0.1", all_local=True
    )
    print(f"backend {backend}{f' ({why})' if why else ''}; fabric env: {env}")

    import torch.multiprocessing as mp

    ctx = mp.spawn(worker, args=(n, _free_port(), backend, env, args), nprocs=n, join=False)
    deadline = time.monotonic() + args.timeout
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                print(f"timed out after {args.timeout:g} s: killing the ranks")
                for p in ctx.processes:
                    p.kill()
                return 1
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as err:
        print(f"a rank failed: {err}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
