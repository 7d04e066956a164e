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
"""

from __future__ import annotations

import contextlib
import os

SWITCH = "JUPYTER_DIST_OWN_SESSION"


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
    return True
