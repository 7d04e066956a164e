"""jupyter-dist: run a notebook cell on many ranks, nodes and GPUs.

`%load_ext jupyter_dist` registers `%%distrun`, `%distrun`, `%dist` and the sidebar's comm
target; no process starts until a run needs one.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["load_ipython_extension", "unload_ipython_extension", "report", "panel", "__version__"]

_session: Any = None


def get_session() -> Any:
    """This kernel's `DistSession` (created on first use)."""
    global _session
    if _session is None:
        from jupyter_dist.run.session import DistSession

        _session = DistSession()
    return _session


def load_ipython_extension(ipython: Any) -> None:
    import atexit

    from jupyter_dist.ui.magics import DistMagics

    session = get_session()
    ipython.register_magics(DistMagics(ipython, session))
    try:
        from jupyter_dist.ui import sidebar as comm
    except ImportError:  # the sidebar protocol is optional for plain IPython
        comm = None
    if comm is not None:
        comm.register(ipython)
        comm.set_cluster_control(session.control())
        from jupyter_dist.cluster.status import add_status_listener

        add_status_listener(session.cluster, comm.notify_status)
    atexit.register(session.shutdown)


def unload_ipython_extension(ipython: Any) -> None:
    if _session is not None:
        _session.shutdown()


# On a rank: record metrics for the live chart (batched, no round trip per call). Bound
# directly, not wrapped: it is a hot path, and jupyter_dist.engine.metrics imports nothing heavy.
from jupyter_dist.engine.metrics import report  # noqa: E402


def panel() -> Any:
    """The configuration panel (ipywidgets)."""
    from jupyter_dist.views.panel import panel as _panel

    return _panel(get_session())
