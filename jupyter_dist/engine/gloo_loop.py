"""gloo's network loop behind the training on a crowded node: its thread's nice raised within the rank.

Each gloo process group runs a `gloo_tcp_loop` thread that waits on `epoll_wait` for its sockets. Data that
arrives before the collective's thread has posted the buffer for it leaves the socket readable, so the
loop wakes again at once and spins (~190,000 `epoll_wait` calls a second per rank at 4 ranks on 2 cores,
against ~7,000 reads) until the thread that would post that buffer gets a core, and it competes with that
thread and with the rank's main thread for the cores. Where a node has at least as many ranks as cores
(each rank then has more busy threads than its share of cores), every gloo loop thread of the process is
given nice LOOP_NICE, for itself only (Linux's nice is per thread; raising it needs no privilege).

That moves CPU inside the rank's session, not between sessions: with autogroups (engine/sessions.py)
the scheduler shares the cores between sessions first, so the rank's share against other users' processes
is unchanged; when the main thread waits in a collective the loop is the rank's only busy thread and
runs as before. Measured under plain torchrun (the same script, the loop's nice set from the script,
benchmarks/README.md): 4 ranks on 2 cores 19,500-27,100 samples/s at nice 0, 27,900-37,000 at nice 10;
2 ranks 20,300-42,300 at 0 (two modes), 31,100-33,400 at 10.

`JUPYTER_DIST_GLOO_LOOP_NICE` sets the level (0 leaves the threads as gloo made them).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from jupyter_dist.engine.frameworks.patch import when_imported, wrap_torch_distributed
from jupyter_dist.engine.sessions import ranks_on_node

SWITCH = "JUPYTER_DIST_GLOO_LOOP_NICE"
LOOP_NICE = 10  # weight 110 of the main thread's 1024
LOOP_THREAD = "gloo_tcp_loop"  # the name gloo's tcp transport gives its loop thread
MAKERS = ("init_process_group", "new_group", "new_subgroups", "new_subgroups_by_enumeration")
MARK = "_jupyter_dist_gloo_loop"  # on a wrapped group maker: wrapped once
TASKS = "/proc/self/task"
_done: set[int] = set()  # thread ids already lowered (a thread id is not reused while the process lives
# with it; a reused one gets lowered again, which is what it would want)


def loop_nice(ranks: int, cores: int, setting: str | None) -> int:
    """The nice for gloo's loop threads: `setting` where given (a whole number; anything else is ignored),
    else LOOP_NICE where the node's `ranks` are at least its `cores`, else 0 (left alone)."""
    if setting is not None and setting.strip().lstrip("-").isdigit():
        return max(0, min(19, int(setting)))
    return LOOP_NICE if ranks >= max(cores, 1) else 0


def wanted_nice() -> int:
    """This rank's `loop_nice`, from its environment and the cores it may run on."""
    return loop_nice(ranks_on_node(), len(os.sched_getaffinity(0)), os.environ.get(SWITCH))


def lower_loop_threads(nice: int | None = None, tasks: str = TASKS) -> list[int]:
    """Give every gloo loop thread of this process not yet seen the nice (never a lower one than it has);
    the ids of those changed."""
    nice = wanted_nice() if nice is None else nice
    if nice <= 0:
        return []
    changed = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(tasks):
            if not tid.isdigit() or int(tid) in _done:
                continue
            try:
                with open(os.path.join(tasks, tid, "comm")) as f:
                    name = f.read().strip()
                if name != LOOP_THREAD or os.getpriority(os.PRIO_PROCESS, int(tid)) >= nice:
                    continue  # another thread, or one already as low (a rank started with `nice`)
                os.setpriority(os.PRIO_PROCESS, int(tid), nice)
            except OSError:  # the thread ended meanwhile
                continue
            _done.add(int(tid))
            changed.append(int(tid))
    return changed


def install() -> None:
    """From now on (or when torch.distributed is imported), lower the loops of every group made."""
    when_imported("torch.distributed", _wrap_module)


def _wrap_module(dist: ModuleType) -> None:
    wrap_torch_distributed(dist, MAKERS, lambda _name, fn: _lowering(fn), MARK)


def _lowering(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)  # keeps the attributes other wrappers mark theirs with (engine/torch_hooks.py)
    def make_group(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        lower_loop_threads()
        return result

    setattr(make_group, MARK, True)
    return make_group
