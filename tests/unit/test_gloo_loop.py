"""engine/gloo_loop.py: on a crowded node gloo's network loop thread gets a higher nice than the rank's
training threads, in a real torch process with a real gloo group; nothing changes elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from jupyter_dist.engine import gloo_loop

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(("ranks", "cores", "setting", "nice"), [
    (4, 2, None, gloo_loop.LOOP_NICE),  # more ranks than cores
    (2, 2, None, gloo_loop.LOOP_NICE),  # as many: each rank still has more busy threads than its share
    (1, 2, None, 0),                    # room to spare: left as gloo made it
    (4, 2, "0", 0),                     # the switch off
    (1, 2, "5", 5),                     # a level asked for applies anywhere
    (4, 2, "40", 19),                   # ... within Linux's range
    (4, 2, "ten", gloo_loop.LOOP_NICE), # not a number: as if unset
])
def test_loop_nice(ranks, cores, setting, nice):
    assert gloo_loop.loop_nice(ranks, cores, setting) == nice


def test_only_threads_named_as_gloo_loops_are_lowered_once():
    """Real threads of this process: one named as gloo names its loop, one not; the first alone is lowered."""
    ready, done = threading.Barrier(3), threading.Event()
    tids: dict[str, int] = {}

    def body(name: str) -> None:
        tids[name] = threading.get_native_id()
        with open(f"/proc/self/task/{tids[name]}/comm", "w") as f:
            f.write(name)
        ready.wait()
        done.wait(30)

    threads = [threading.Thread(target=body, args=(n,), daemon=True) for n in (gloo_loop.LOOP_THREAD, "other")]
    for t in threads:
        t.start()
    ready.wait()
    try:
        main_before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        changed = gloo_loop.lower_loop_threads(nice=7)
        assert changed == [tids[gloo_loop.LOOP_THREAD]]
        assert os.getpriority(os.PRIO_PROCESS, tids[gloo_loop.LOOP_THREAD]) == 7
        assert os.getpriority(os.PRIO_PROCESS, tids["other"]) == main_before
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_before
        assert gloo_loop.lower_loop_threads(nice=7) == []  # seen already
        assert gloo_loop.lower_loop_threads(nice=0) == []  # 0: nothing to do
    finally:
        done.set()
        for t in threads:
            t.join(10)


GROUP = """
import json, os, sys, tempfile
from jupyter_dist.engine import gloo_loop
gloo_loop.install()  # before torch.distributed is imported, as an engine's set-up does
import torch.distributed as dist
with tempfile.TemporaryDirectory() as tmp:
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp, "s"), 1), rank=0, world_size=1)
    sub = dist.new_group([0])
    nices = {}
    for tid in os.listdir("/proc/self/task"):
        name = open(f"/proc/self/task/{tid}/comm").read().strip()
        nices.setdefault(name, []).append(os.getpriority(os.PRIO_PROCESS, int(tid)))
    dist.destroy_process_group()
print(json.dumps(nices))
"""


def group_threads(env: dict[str, str]) -> dict[str, list[int]]:
    """Each thread name of a real process that made a gloo group and a subgroup -> its threads' nices."""
    out = subprocess.run([sys.executable, "-c", GROUP], capture_output=True, text=True, timeout=90, check=True,
                         env={**{k: v for k, v in os.environ.items() if k != gloo_loop.SWITCH}, **env})
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_crowded_ranks_gloo_groups_have_their_loops_lowered():
    cores = len(os.sched_getaffinity(0))
    nices = group_threads({"LOCAL_WORLD_SIZE": str(2 * cores)})
    loops = nices[gloo_loop.LOOP_THREAD]
    assert len(loops) >= 2  # the default group's and the subgroup's
    assert set(loops) == {gloo_loop.LOOP_NICE}
    base = os.getpriority(os.PRIO_PROCESS, 0)  # the child's threads start at this process's nice
    assert all(n == base for name, ns in nices.items() if name != gloo_loop.LOOP_THREAD for n in ns)


def test_a_rank_with_cores_to_spare_or_the_switch_off_keeps_them():
    cores, base = len(os.sched_getaffinity(0)), os.getpriority(os.PRIO_PROCESS, 0)
    if cores > 1:
        assert set(group_threads({"LOCAL_WORLD_SIZE": "1"})[gloo_loop.LOOP_THREAD]) == {base}
    off = group_threads({"LOCAL_WORLD_SIZE": str(2 * cores), gloo_loop.SWITCH: "0"})
    assert set(off[gloo_loop.LOOP_THREAD]) == {base}
