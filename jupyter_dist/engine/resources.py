"""This rank's CPU, memory and GPU use, sampled about once a second by a thread of its own.

The sampler keeps the last samples in a ring; the notebook reads them through the agent's
"resources" op (`{"since": t}`: the samples after t), so nothing rides on the cell's output and
a busy main thread does not delay them. A sample:

    {"t": time, "cpu": percent of one core, "rss": bytes, "mem_total": bytes, "mem_avail": bytes,
     "gpus": [{"index", "util", "mem" (this process's bytes), "mem_used", "mem_total"}],
     "workers": [{"rank" (None: this engine's), "pid", "cpu", "rss", "gpus"}]}   (only while any runs)

`workers` are the processes doing a rank's work while the engine waits on them (--fresh's child,
torchrun's workers: engine/workers.py), each with those under it summed; the notebook takes their
figures as their ranks' (run/resources.py). Setting JUPYTER_DIST_OBSERVE=0 in a rank's environment
(`--env`) stops the sampling (and collectives.py's records) for a run: benchmarks measure the cost
with it; the answer's `cost` is the CPU time the sampler and the answers took.

`mem_total`/`mem_avail` are the host's, or the cgroup's limit where one is set. GPUs come from
NVML (nvidia-ml-py) where it finds any; without it, or without GPUs, `gpus` is empty.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from typing import Any

from jupyter_dist.engine import agent, workers

INTERVAL = 1.0  # seconds between samples
KEEP = 600  # samples kept (ten minutes)
SWITCH = "JUPYTER_DIST_OBSERVE"  # "0" in a rank's environment (--env): no sampling, no collective records

_state: dict[str, Any] = {"thread": None, "samples": deque(maxlen=KEEP), "cpu_s": 0.0, "began": 0.0}
_procs: dict[int, Any] = {}  # pid -> psutil.Process, kept so that cpu_percent counts from the last sample
_lock = threading.Lock()


def observing() -> bool:
    return os.environ.get(SWITCH, "1") != "0"


def start(interval: float = INTERVAL) -> None:
    """Start the sampler once per engine (a daemon thread)."""
    if _state["thread"] is not None:
        return
    thread = threading.Thread(target=_run, args=(interval,), name="jupyter-dist resources", daemon=True)
    _state["thread"] = thread
    _state["began"] = time.monotonic()
    thread.start()


def _run(interval: float) -> None:
    import psutil  # a dependency of jupyter-dist; imported by the thread, not at the engine's set-up

    process = psutil.Process()
    process.cpu_percent(None)  # the first call starts the count
    gpus = _Gpus()
    while True:
        time.sleep(interval)
        c0 = time.thread_time()
        if observing():
            with contextlib.suppress(Exception):  # a sample missed is no reason to stop sampling
                sample = _sample(process, psutil, gpus)
                with _lock:
                    _state["samples"].append(sample)
        _state["cpu_s"] += time.thread_time() - c0  # this thread's own cost (benchmarks/README.md)


def _sample(process: Any, psutil: Any, gpus: _Gpus) -> dict[str, Any]:
    vm = psutil.virtual_memory()
    total, avail = vm.total, vm.available
    limit = _cgroup_limit()
    if limit and limit < total:
        total, avail = limit, max(0, limit - _cgroup_usage())
    devices = gpus.read()
    sample = {"t": time.time(), "cpu": process.cpu_percent(None), "rss": process.memory_info().rss,
              "mem_total": total, "mem_avail": avail, "gpus": gpu_figures(devices, {process.pid})}
    seen: set[int] = set()
    found = workers.workers()
    if found:
        sample["workers"] = [_worker(rank, pid, psutil, devices, seen) for rank, pid in found]
    for pid in set(_procs) - seen:
        _procs.pop(pid, None)  # a worker that ended
    return sample


def _worker(rank: int | None, pid: int, psutil: Any, devices: list[dict[str, Any]], seen: set[int]) -> dict[str, Any]:
    """A worker's figures: its process and those under it (a data loader's workers), summed."""
    top = _proc(pid, psutil)
    tree = [top]
    with contextlib.suppress(psutil.Error):
        tree += [_proc(c.pid, psutil) for c in top.children(recursive=True)]
    seen.update(p.pid for p in tree)
    cpu = rss = 0.0
    for proc in tree:
        with contextlib.suppress(psutil.Error):
            cpu += proc.cpu_percent(None)
            rss += proc.memory_info().rss
    return {"rank": rank, "pid": pid, "cpu": cpu, "rss": int(rss),
            "gpus": gpu_figures(devices, {p.pid for p in tree})}


def _proc(pid: int, psutil: Any) -> Any:
    if pid not in _procs:
        _procs[pid] = psutil.Process(pid)
        with contextlib.suppress(psutil.Error):
            _procs[pid].cpu_percent(None)  # the first call starts the count
    return _procs[pid]


def _cgroup_limit() -> int:
    with contextlib.suppress(OSError, ValueError):
        with open("/sys/fs/cgroup/memory.max") as f:
            text = f.read().strip()
        return 0 if text == "max" else int(text)
    return 0


def _cgroup_usage() -> int:
    with contextlib.suppress(OSError, ValueError), open("/sys/fs/cgroup/memory.current") as f:
        return int(f.read().strip())
    return 0


def gpu_figures(devices: list[dict[str, Any]], pids: set[int]) -> list[dict[str, Any]]:
    """A rank's GPU figures from NVML's per-device reading: the devices where any of `pids` holds memory,
    each with the device's utilisation and memory and those processes' memory summed. Pure.

    `devices`: [{"index", "util" (%), "mem_used", "mem_total" (bytes), "procs": [(pid, bytes or None)]}],
    as `_Gpus.read` makes it (NVML reports None for a process's memory it may not see)."""
    out = []
    for d in devices:
        mine = sum(used or 0 for pid, used in d["procs"] if pid in pids)
        if any(pid in pids for pid, _ in d["procs"]):
            out.append({"index": d["index"], "util": d["util"], "mem": mine, "mem_used": d["mem_used"],
                        "mem_total": d["mem_total"]})
    return out


class _Gpus:
    """NVML's reading of every GPU once a sample: utilisation, memory, each process's memory."""

    def __init__(self) -> None:
        self.nvml: Any = None
        self.handles: list[Any] = []
        try:
            import pynvml  # optional (nvidia-ml-py): only where NVML finds GPUs

            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.nvml = pynvml
        except Exception:  # noqa: BLE001 - no library, no driver, no GPU: no GPU samples
            self.handles = []

    def read(self) -> list[dict[str, Any]]:
        out = []
        for index, handle in enumerate(self.handles):
            with contextlib.suppress(Exception):
                procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)
                if not procs:
                    continue  # no process on it: nobody's GPU
                mem = self.nvml.nvmlDeviceGetMemoryInfo(handle)
                out.append({"index": index, "util": self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                            "mem_used": mem.used, "mem_total": mem.total,
                            "procs": [(p.pid, p.usedGpuMemory) for p in procs]})
        return out


def samples(args: dict[str, Any] | None = None) -> dict[str, Any]:
    """The agent's "resources": the samples after `args["since"]` (all kept ones by default)."""
    c0 = time.thread_time()
    since = float((args or {}).get("since") or 0.0)
    with _lock:
        got = [s for s in _state["samples"] if s["t"] > since]
    _state["cpu_s"] += time.thread_time() - c0
    return {"pid": os.getpid(), "samples": got, "cost": cost()}


def cost() -> dict[str, float]:
    """CPU seconds the sampler and these answers took on this engine, over the seconds since it started."""
    return {"cpu_s": _state["cpu_s"], "wall_s": time.monotonic() - _state["began"] if _state["began"] else 0.0}


def register() -> None:
    start()
    agent.register("resources", samples)
