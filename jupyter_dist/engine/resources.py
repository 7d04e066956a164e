"""This rank's CPU, memory and GPU use, sampled about once a second by a thread of its own.

The sampler keeps the last samples in a ring; the notebook reads them through the agent's
"resources" op (`{"since": t}`: the samples after t), so nothing rides on the cell's output and
a busy main thread does not delay them. A sample:

    {"t": time, "cpu": percent of one core, "rss": bytes, "mem_total": bytes, "mem_avail": bytes,
     "gpus": [{"index", "util", "mem" (this process's bytes), "mem_used", "mem_total"}]}

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

from jupyter_dist.engine import agent

INTERVAL = 1.0  # seconds between samples
KEEP = 600  # samples kept (ten minutes)

_state: dict[str, Any] = {"thread": None, "samples": deque(maxlen=KEEP), "nvml": None}
_lock = threading.Lock()


def start(interval: float = INTERVAL) -> None:
    """Start the sampler once per engine (a daemon thread)."""
    if _state["thread"] is not None:
        return
    thread = threading.Thread(target=_run, args=(interval,), name="jupyter-dist resources", daemon=True)
    _state["thread"] = thread
    thread.start()


def _run(interval: float) -> None:
    import psutil  # a dependency of jupyter-dist; imported by the thread, not at the engine's set-up

    process = psutil.Process()
    process.cpu_percent(None)  # the first call starts the count
    gpus = _Gpus()
    while True:
        time.sleep(interval)
        with contextlib.suppress(Exception):  # a sample missed is no reason to stop sampling
            sample = _sample(process, psutil, gpus)
            with _lock:
                _state["samples"].append(sample)


def _sample(process: Any, psutil: Any, gpus: _Gpus) -> dict[str, Any]:
    vm = psutil.virtual_memory()
    total, avail = vm.total, vm.available
    limit = _cgroup_limit()
    if limit and limit < total:
        total, avail = limit, max(0, limit - _cgroup_usage())
    return {"t": time.time(), "cpu": process.cpu_percent(None), "rss": process.memory_info().rss,
            "mem_total": total, "mem_avail": avail, "gpus": gpus.sample(process.pid)}


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


class _Gpus:
    """NVML's view of the GPUs this process uses: utilisation of the device, memory of the process."""

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

    def sample(self, pid: int) -> list[dict[str, Any]]:
        out = []
        for index, handle in enumerate(self.handles):
            with contextlib.suppress(Exception):
                procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)
                mine = sum(p.usedGpuMemory or 0 for p in procs if p.pid == pid)
                if not mine:
                    continue  # a GPU this rank does not use
                mem = self.nvml.nvmlDeviceGetMemoryInfo(handle)
                util = self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu
                out.append({"index": index, "util": util, "mem": mine, "mem_used": mem.used, "mem_total": mem.total})
        return out


def samples(args: dict[str, Any] | None = None) -> dict[str, Any]:
    """The agent's "resources": the samples after `args["since"]` (all kept ones by default)."""
    since = float((args or {}).get("since") or 0.0)
    with _lock:
        got = [s for s in _state["samples"] if s["t"] > since]
    return {"pid": os.getpid(), "samples": got}


def register() -> None:
    start()
    agent.register("resources", samples)
