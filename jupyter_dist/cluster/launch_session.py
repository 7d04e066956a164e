"""Start ipyparallel's controller and engines in the kernel's session, each in a process group of its own.

ipyparallel starts them with `start_new_session=True`: that keeps the kernel's signals away from them,
and also gives each a scheduler autogroup of its own wherever Linux's `sched_autogroup_enabled` is on
(the default of most distribution kernels, this machine's too), where CPU is shared out between
sessions first. torchrun started under `setsid` trained DDP about 4% slower here than the same torchrun
started from the caller's session; for `%distrun` the change measured within this machine's noise
(benchmarks/README.md). A process group of their own still keeps them out of the signals a kernel's
group gets (an interrupt, a kill of the kernel's group), which is what the new session was for.
Each rank's engine then moves itself into a session of its own at set-up (engine/sessions.py), as
torchrun's workers are: on a loaded machine the ranks of one session trained DDP 0.71x torchrun, 0.98x in
sessions of their own; the controller and mpiexec stay here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from jupyter_dist.common.process_group import own_group


@contextlib.contextmanager
def in_this_session() -> Iterator[None]:
    """While inside: processes ipyparallel's launchers start stay in this session, in a group of their own."""
    from ipyparallel.cluster import launcher

    original = getattr(launcher, "Popen", None)
    if original is None:  # another ipyparallel: leave its launchers as they are
        yield
        return

    def popen(*args: Any, start_new_session: bool = False, **kwargs: Any) -> Any:
        if start_new_session and "process_group" not in kwargs and "preexec_fn" not in kwargs:
            kwargs.update(own_group())
        return original(*args, **kwargs)

    launcher.Popen = popen
    try:
        yield
    finally:
        launcher.Popen = original
