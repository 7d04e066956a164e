"""`%dist bench allreduce` on the ranks: all-reduce timings and the local copy bandwidth.

`allreduce_bench` runs on every rank (it is sent to the engines as a function) and returns the
same rows everywhere; the kernel formats them (`jupyter_dist.tools.bench_report`). Numbers
follow nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n for all-reduce, GB = 1e9 B.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["DEFAULT_SIZES", "allreduce_bench", "bus_factor", "local_copy_bandwidth"]

MiB = 1 << 20
# 8 B .. 64 MiB in steps of 4 (8, 32, 128, ... 32 MiB) plus 64 MiB at the top: 13 sizes.
DEFAULT_SIZES: tuple[int, ...] = (*(8 * 4**k for k in range(12)), 64 * MiB)

Row = dict[str, Any]


def bus_factor(world_size: int) -> float:
    """nccl-tests' all-reduce bus-bandwidth factor 2(n-1)/n (0 for a single rank)."""
    return 2.0 * (world_size - 1) / world_size if world_size > 0 else 0.0


def allreduce_bench(
    sizes: Sequence[int] | None = None,
    *,
    iters: int = 5,
    warmup: int = 2,
    dtype: str = "float32",
    check: bool = True,
) -> list[Row]:
    """Time `all_reduce(SUM)` at each size on every rank; every rank returns the same rows.

    Uses the default process group when it exists. Otherwise it makes one from `env://`
    with the backend in JUPYTER_DIST_BACKEND (default gloo) and destroys it afterwards, so a
    cell's own `init_process_group` still works. Tensors live on the current CUDA device
    under NCCL (the caller has done `torch.cuda.set_device(LOCAL_RANK)`), else on the CPU.
    Each size's time is the slowest rank's mean over `iters` (an all_reduce MAX);
    `wrong` counts elements that differ from the expected sum in a check before the timing.
    """
    import torch  # heavy and optional: only when the bench runs
    import torch.distributed as dist

    made_group = False
    if not dist.is_initialized():
        backend = os.environ.get("JUPYTER_DIST_BACKEND", "gloo") or "gloo"
        if backend == "nccl" and "LOCAL_RANK" in os.environ:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group(backend, init_method="env://")
        made_group = True
    try:
        backend = str(dist.get_backend())
        world = dist.get_world_size()
        rank = dist.get_rank()
        device = _bench_device(backend)
        tdtype = getattr(torch, dtype)
        esize = torch.empty((), dtype=tdtype).element_size()
        factor = bus_factor(world)
        rows: list[Row] = []
        for size in DEFAULT_SIZES if sizes is None else sizes:
            count = max(1, int(size) // esize)
            nbytes = count * esize
            buf = torch.empty(count, dtype=tdtype, device=device)
            wrong = 0
            if check:
                buf.fill_(rank + 1)
                dist.all_reduce(buf)
                expected = world * (world + 1) // 2
                wrong = int((buf != expected).sum().item())
            buf.fill_(1)
            for _ in range(warmup):
                dist.all_reduce(buf)
            _sync(device)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(buf)
            _sync(device)
            elapsed = (time.perf_counter() - start) / max(1, iters)
            stats = torch.tensor([elapsed], dtype=torch.float64, device=device)
            dist.all_reduce(stats, op=dist.ReduceOp.MAX)
            errs = torch.tensor([wrong], dtype=torch.int64, device=device)
            dist.all_reduce(errs)
            t = float(stats.item())
            algbw = nbytes / t / 1e9 if t > 0 else 0.0
            rows.append(
                {
                    "size_bytes": nbytes,
                    "count": count,
                    "dtype": dtype,
                    "time_us": t * 1e6,
                    "algbw_GBps": algbw,
                    "busbw_GBps": algbw * factor,
                    "wrong": int(errs.item()),
                }
            )
            del buf
        return rows
    finally:
        if made_group:
            dist.destroy_process_group()


def local_copy_bandwidth(size_bytes: int = 64 * MiB, *, repeats: int = 5, device: str | None = None) -> float:
    """GB/s of the best of `repeats` tensor copies of `size_bytes` on one rank: the local ceiling.

    The device is the current CUDA device under an NCCL group (or when `device="cuda"`), else CPU.
    """
    import torch  # heavy and optional: only when the bench runs

    if device is None:
        device = _bench_device(_current_backend())
    dev = torch.device(device)
    src = torch.ones(max(1, size_bytes // 4), dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    dst.copy_(src)
    _sync(dev)
    best = float("inf")
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        dst.copy_(src)
        _sync(dev)
        best = min(best, time.perf_counter() - start)
    return src.numel() * 4 / best / 1e9 if best > 0 else 0.0


# ---------------------------------------------------------------------------------------------
# helpers


def _current_backend() -> str | None:
    try:
        import torch.distributed as dist  # heavy and optional: only when the bench runs

        return str(dist.get_backend()) if dist.is_initialized() else None
    except Exception:
        return None


def _bench_device(backend: str | None) -> Any:
    import torch  # heavy and optional: only when the bench runs

    # "nccl", or a combined group such as "cpu:gloo,cuda:nccl" (torch's default with CUDA)
    if backend and "nccl" in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _sync(device: Any) -> None:
    import torch  # heavy and optional: only when the bench runs

    if getattr(device, "type", str(device)).startswith("cuda"):
        torch.cuda.synchronize(device)
