"""Engines forked from the node's fork server (`DistSettings.fork_engines`, cluster/zygote.py) under a real
mpiexec: distinct processes, children of the server, one MPI world, each with its rank's environment; a
rank's crash reported as for an engine mpiexec started itself; nothing left once the cluster stops."""

from __future__ import annotations

import os

import psutil
import pytest

import jupyter_dist
from jupyter_dist.errors import RankFailure
from jupyter_dist.plan.settings import settings

pytestmark = [pytest.mark.engines, pytest.mark.timeout(240)]
LAYOUT = "-f pytorch -N 2 -n 2"


@pytest.fixture(scope="module", autouse=True)
def forking(shell):
    before = settings().fork_engines
    settings().fork_engines = True
    yield
    settings().fork_engines = before


def cluster():
    return jupyter_dist.get_session().cluster


def test_ranks_are_forked_children_of_the_server_with_their_environment(distrun, shell):
    distrun(f"{LAYOUT} -o env", "import os, sys\nenv = (os.getpid(), os.environ['RANK'], os.environ['LOCAL_RANK'], "
            "os.environ.get('OMPI_COMM_WORLD_RANK'), 'torch' in sys.modules)")
    server = cluster()._zygote
    assert server is not None and server.proc.poll() is None
    got = shell.user_ns["env"]
    pids = [g[0] for g in got]
    assert len(set(pids)) == 4
    assert all(psutil.Process(pid).ppid() == server.pid for pid in pids)
    assert [g[1:4] for g in got] == [(str(r), str(r % 2), str(r)) for r in range(4)]
    assert all(g[4] for g in got)  # torch was imported before the fork, once


def test_gloo_all_reduce_and_mpi_world(distrun, shell):
    distrun(f"{LAYOUT} -o ok", "import torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo', init_method='env://')\n"
            "t = torch.ones(1); dist.all_reduce(t); ok = t.item()")
    assert shell.user_ns["ok"] == [4.0] * 4
    distrun("-f mpi -N 2 -n 2 -o s", "from mpi4py import MPI\ns = MPI.COMM_WORLD.allreduce(MPI.COMM_WORLD.Get_rank())")
    assert shell.user_ns["s"] == [6] * 4


def test_a_segfault_is_reported_and_the_next_cell_runs(distrun, shell):
    distrun(f"{LAYOUT}", "x = 1")
    with pytest.raises(RankFailure) as info:
        shell.run_cell_magic("distrun", f"{LAYOUT} --timeout 120",
                             "import ctypes, os, time\nif int(os.environ['RANK']) == 1:\n"
                             "    time.sleep(0.05); ctypes.string_at(0)\ntime.sleep(30)\n")
    assert "crashed: Segmentation fault" in str(info.value)
    distrun(f"{LAYOUT} -o ok", "ok = 1")
    assert shell.user_ns["ok"] == [1] * 4


def test_a_crowded_nodes_ranks_share_the_servers_session_else_each_has_its_own(distrun, shell):
    """engine/sessions.py: beyond 2 ranks a core the node's ranks weigh one session beside the kernel's."""
    distrun(f"{LAYOUT} -o ids", "import os, sys\nids = (os.getpid(), os.getsid(0), "
            "hasattr(sys.stdout.write, 'flood_counted'))")  # 4 ranks, 2+ cores
    assert all(pid == sid for pid, sid, _ in shell.user_ns["ids"])  # each a session of its own
    assert not any(counted for _, _, counted in shell.user_ns["ids"])  # engine/flood_signal.py leaves them be
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})  # the cluster started from here sees one core: 3 ranks crowd it
    try:
        distrun("-f mpi -N 1 -n 3 -o ids", "import os\nids = (os.getpid(), os.getsid(0))")
    finally:
        os.sched_setaffinity(0, cores)
    server = cluster()._zygote
    assert os.getsid(server.pid) == server.pid != os.getsid(0)  # the server leads a session, not the kernel's
    assert [sid for _, sid in shell.user_ns["ids"]] == [server.pid] * 3


FLOODING = """import time
def session_nice():
    with open('/proc/self/autogroup') as f:
        return int(f.read().split()[-1])
seen, end = session_nice(), time.monotonic() + 60
while seen != 9 and time.monotonic() < end:  # until the kernel, flooded, has made this session lighter
    for i in range(2000):
        print('line', i, 'of a flood of output, long enough to be a real line')
    seen = session_nice()
"""


def test_a_crowded_nodes_session_weighs_less_while_its_output_floods_the_kernel(distrun, shell):
    """cluster/session_weight.py, engine/flood_signal.py: autogroup nice 9 while the ranks' output floods the
    kernel, 0 again after."""
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})  # 3 ranks crowd the one core the cluster sees
    try:
        distrun("-f mpi -N 1 -n 3", "x = 1")
    finally:
        os.sched_setaffinity(0, cores)
    server = cluster()._zygote
    assert server.weight is not None and server.weight.base == 0
    distrun("-f mpi -N 1 -n 3 -o seen", FLOODING)
    assert shell.user_ns["seen"] == [9, 9, 9]
    with open(f"/proc/{server.pid}/autogroup") as f:
        assert f.read().split()[-1] == "0"  # back at its base once the run ended
    distrun("-f mpi -N 1 -n 3 -o quiet", "print('one line')\nwith open('/proc/self/autogroup') as f:\n"
            "    quiet = f.read().split()[-1]")
    assert shell.user_ns["quiet"] == ["0"] * 3  # a line is no flood
    # engine/flood_signal.py: rank 0 alone prints 10,000 characters at once, less than a drain the kernel
    # calls a flood; the rank lightens its session itself at once, and the kernel sets it back at the end
    distrun("-f mpi -N 1 -n 3 -o own", "import os\nif os.environ['OMPI_COMM_WORLD_RANK'] == '0':\n    print('x' * 10000)\n"
            "with open('/proc/self/autogroup') as f:\n    own = f.read().split()[-1]")
    assert shell.user_ns["own"][0] == "9"
    with open(f"/proc/{server.pid}/autogroup") as f:
        assert f.read().split()[-1] == "0"


def test_nothing_is_left_after_stop(distrun, shell):
    distrun(f"{LAYOUT} -o pid", "import os\npid = os.getpid()")
    server = cluster()._zygote
    pids = [server.pid, *shell.user_ns["pid"]]
    cluster().stop()
    assert cluster()._zygote is None
    left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert left == [], f"still running: {left}"
    assert not os.path.exists(server.socket) or server.proc.poll() is not None
