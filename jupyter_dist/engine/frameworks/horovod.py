"""Engine side of Horovod (Gloo): rank 0 serves Horovod's HTTP rendezvous for the run's layout.

The kernel puts every node's Horovod host name in rank 0's environment (`NODES_VAR`); from it
and the `HOROVOD_*` variables rank 0 serves what `horovodrun --gloo` would hand out.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

NODES_VAR = "JUPYTER_DIST_HOROVOD_NODES"  # rank 0 only: every node's Horovod host name

_served: dict[str, Any] = {}


def host_plan(env: dict[str, str] | os._Environ[str]) -> list[tuple[str, int, int, int, int, int, int]]:
    """(hostname, rank, local_rank, cross_rank, size, local_size, cross_size) of every rank, as
    horovodrun's rendezvous hands them out, from rank 0's environment."""
    size, local = int(env["HOROVOD_SIZE"]), int(env["HOROVOD_LOCAL_SIZE"])
    names = env[NODES_VAR].split(",")
    return [(names[r // local], r, r % local, r // local, size, local, len(names)) for r in range(size)]


def serve_rendezvous() -> None:
    """Engine hook: on rank 0 of a Horovod run, Horovod's HTTP rendezvous for the run's plan."""
    env = os.environ
    if env.get("JUPYTER_DIST_FRAMEWORK") != "horovod" or env.get("HOROVOD_RANK") != "0":
        return
    if importlib.util.find_spec("horovod") is None:
        return
    plan = host_plan(env)
    port = int(env["HOROVOD_GLOO_RENDEZVOUS_PORT"])
    key = repr((plan, port))
    if _served.get("key") == key:
        return
    stop_rendezvous()
    from horovod.runner.common.util.hosts import SlotInfo
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
    from horovod.runner.util.threads import in_thread

    try:
        server = RendezvousHTTPServer(("", port), RendezvousHandler, 0)
    except OSError as e:
        if "tensorflow" in sys.modules:  # its gRPC server cannot be stopped (engine.frameworks.tensorflow)
            raise RuntimeError(f"Horovod's rendezvous port {port} is held by this engine's TensorFlow server, "
                               "and TensorFlow cannot leave a cluster it joined: run %dist restart, then the "
                               "cell again") from e
        raise
    server.init([SlotInfo(*slot) for slot in plan])
    in_thread(target=server.serve_forever)
    _served.update(key=key, server=server)


def stop_rendezvous() -> None:
    """Stop the rendezvous this engine serves, if any, and free its port."""
    old = _served.pop("server", None)
    _served.pop("key", None)
    if old is not None:
        old.shutdown()
        old.server_close()
