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

A session each also means that 32 busy ranks on 2 cores got 32 shares to the notebook kernel's one: during
a 32-rank burst of output the kernel (its sidebar's subshell, its widgets) waited 0.3-0.9 s at a time.
So where a node runs more than SESSIONS_PER_CORE ranks per core, each engine lowers its autogroup's weight
(its nice, which a process may raise without privileges) until the node's ranks together weigh about as
much as that many ordinary sessions: the kernel keeps at least 1/(2 x cores + 1) of a node whose every rank
is busy, and up to 2 ranks per core nothing changes (DDP against other users' processes keeps its share).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import threading
import time

SWITCH = "JUPYTER_DIST_OWN_SESSION"
SESSIONS_PER_CORE = 2
# the scheduler's weight of each nice level 0..19 (Linux's sched_prio_to_weight); an autogroup's nice sets its weight
WEIGHTS = (1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87, 70, 56, 45, 36, 29, 23, 18, 15)
AUTOGROUP = "/proc/self/autogroup"
RETRY_FOR_S = 15.0  # without CAP_SYS_ADMIN, Linux takes one autogroup nice change per 0.1 s, machine-wide


def own_session() -> bool:
    """Move this process into a new session (and a process group of the same id); True when it moved.

    A process-group leader cannot start a session (mpiexec makes each rank one), so it first joins its
    parent's group, for the instant before `setsid`, and returns to a group of its own if that fails."""
    pid = os.getpid()
    if os.environ.get(SWITCH) == "0" or os.getsid(0) == pid:
        return False
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
    nice = share_nice(ranks_on_node(), len(os.sched_getaffinity(0)))
    if nice:
        set_autogroup_nice(nice)
    return True


def ranks_on_node() -> int:
    """This node's ranks, from the rank's environment (torch's LOCAL_WORLD_SIZE, else Open MPI's)."""
    for name in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def share_nice(ranks: int, cores: int) -> int:
    """The autogroup nice of each of a node's `ranks` engines: 0 up to SESSIONS_PER_CORE x `cores` ranks;
    beyond, the level whose weight is nearest to that many sessions' weight shared out among the ranks."""
    sessions = SESSIONS_PER_CORE * max(cores, 1)
    if ranks <= sessions:
        return 0
    target = WEIGHTS[0] * sessions / ranks
    return min(range(len(WEIGHTS)), key=lambda nice: abs(WEIGHTS[nice] - target))


def set_autogroup_nice(nice: int) -> None:
    """Set this session's autogroup nice now, or, while Linux refuses it as too soon after another
    process's change (EAGAIN: a node's engines all set theirs at once), from a thread that tries again."""
    if _write_nice(nice) == errno.EAGAIN:
        threading.Thread(target=_retry, args=(nice,), name="jupyter-dist autogroup", daemon=True).start()


def _write_nice(nice: int) -> int:
    """0 when set, else the errno (a kernel without autogroups: ENOENT, left as it is)."""
    try:
        with open(AUTOGROUP, "w") as f:
            f.write(str(nice))
    except OSError as e:
        return e.errno or errno.EIO
    return 0


def _retry(nice: int) -> None:
    end = time.monotonic() + RETRY_FOR_S
    while time.monotonic() < end:
        time.sleep(random.uniform(0.1, 0.3))
        if _write_nice(nice) != errno.EAGAIN:
            return
