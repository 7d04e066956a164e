"""A rank's engine in a session of its own, as torchrun starts each of its workers.

Linux with autogroups (`/proc/sys/kernel/sched_autogroup_enabled` = 1, the default of most distribution
kernels and of this machine) shares the cores between sessions first, then between the processes of a
session. mpiexec's ranks sit in the kernel's session (cluster/launch_session.py), with the kernel, the
controller, `prterun` and any spare engines: where other sessions want the cores, all the ranks together
got one session's share, where torchrun's workers (`start_new_session=True` in torch's elastic
subprocess handler) get one each. So each engine moves itself into a new session before it trains.

The process group stays the engine's own (its id is again the engine's pid), so whoever stops the
engines by process group (prterun, `EngineCluster.stop`, the watchdog by pid) still reaches them; signals
to the kernel's group never reached them before either. `JUPYTER_DIST_OWN_SESSION=0` in the environment
keeps them where they are (for measuring the difference: benchmarks/ddp_throughput.py `--ab-sessions`).

A session each also means that 32 busy ranks on 2 cores got 32 equal shares to the notebook kernel's one:
during a 32-rank burst of output the kernel (its sidebar's subshell, its widgets) waited 0.3-0.9 s at a time.
So on a crowded node (more than RANKS_PER_CORE ranks a core, common/crowding.py) the ranks share one session,
as ipyparallel's engines do: the kernel starts the node's fork server in a session of its own
(cluster/zygote.py) and each engine forked from it stays there, so all the node's ranks together weigh
what the kernel's session weighs (a subshell's median wait during a 32-rank burst 4-12 ms, where
sessions of their own at nice 3 gave 9-140 ms; its worst still up to 0.8 s in some runs; a warm `x = 1`
unchanged: benchmarks/README.md "Fifteenth session"); while their output floods the kernel, the kernel
makes that session lighter still (cluster/session_weight.py). Where no such session holds them (engines started by mpiexec
itself: other launchers, other hosts), a crowded node's engines still take sessions of their own, each
at autogroup nice CROWDED_NICE (a process may raise it without privileges): a little weight is what the
kernel's wake-ups need (the scheduler runs the earliest virtual deadline, and a lighter session's comes
later). Up to 2 ranks a core nothing changes (DDP against other users' processes keeps its share).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import threading
import time

from jupyter_dist.common.autogroup import autogroup_path, write_nice
from jupyter_dist.common.crowding import crowded

SWITCH = "JUPYTER_DIST_OWN_SESSION"
CROWDED_NICE = 3  # weight 526 of a normal session's 1024
AUTOGROUP = autogroup_path()
RETRY_FOR_S = 15.0  # without CAP_SYS_ADMIN, Linux takes one autogroup nice change per 0.1 s, machine-wide


def own_session() -> bool:
    """Move this process into a new session (and a process group of the same id); True when it moved.

    A process-group leader cannot start a session (mpiexec makes each rank one), so it first joins its
    parent's group, for the instant before `setsid`, and returns to a group of its own if that fails."""
    pid = os.getpid()
    if os.environ.get(SWITCH) == "0" or os.getsid(0) == pid:
        return False
    crowd = crowded(ranks_on_node(), len(os.sched_getaffinity(0)))
    if crowd and os.getsid(0) == os.getppid():
        return False  # the crowded node's ranks share the session their parent leads (the fork server's)
    leader = os.getpgid(0) == pid
    try:
        if leader:
            os.setpgid(0, os.getpgid(os.getppid()))  # EPERM where the parent is in another session
        os.setsid()
    except OSError:
        if leader and os.getpgid(0) != pid:
            with contextlib.suppress(OSError):
                os.setpgid(0, 0)
        return False
    if crowd:
        set_autogroup_nice(CROWDED_NICE)
    return True


def ranks_on_node() -> int:
    """This node's ranks, from the rank's environment (torch's LOCAL_WORLD_SIZE, else Open MPI's)."""
    for name in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def set_autogroup_nice(nice: int) -> None:
    """Set this session's autogroup nice now, or, while Linux refuses it as too soon after another
    process's change (EAGAIN: a node's engines all set theirs at once), from a thread that tries again."""
    if write_nice(AUTOGROUP, nice) == errno.EAGAIN:
        threading.Thread(target=_retry, args=(nice,), name="jupyter-dist autogroup", daemon=True).start()


def _retry(nice: int) -> None:
    end = time.monotonic() + RETRY_FOR_S
    while time.monotonic() < end:
        time.sleep(random.uniform(0.1, 0.3))
        if write_nice(AUTOGROUP, nice) != errno.EAGAIN:
            return
