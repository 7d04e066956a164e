"""jupyter-dist: run a notebook cell on many ranks, nodes and GPUs.

`%load_ext jupyter_dist` registers `%%distrun`, `%distrun`, `%dist` and the sidebar's comm
target, and probes this host in a thread; no engine starts until a run needs one, unless
`DistSettings.background_start` says to start them now (run/warm_start.py).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["load_ipython_extension", "unload_ipython_extension", "report", "panel", "__version__"]

_session: Any = None
_sidebar: Any = None  # the sidebar comm's kernel side (`ui.sidebar.Sidebar`), one per kernel


def get_session() -> Any:
    """This kernel's `DistSession` (created on first use), with the views as its sinks and display."""
    global _session
    if _session is None:
        from jupyter_dist.run.session import DistSession
        from jupyter_dist.views.live_output import default_sink
        from jupyter_dist.views.run_display import NOTEBOOK

        _session = DistSession(sink_factory=default_sink, display=NOTEBOOK)
    return _session


def load_ipython_extension(ipython: Any) -> None:
    import atexit

    from jupyter_dist.run.warm_start import at_load
    from jupyter_dist.ui.magics import DistMagics

    session = get_session()
    ipython.register_magics(DistMagics(ipython, session))
    _wire_sidebar(ipython, session)
    atexit.register(session.shutdown)
    if line := at_load(ipython, session):  # the host probe ahead of the first cell; the engines if set so
        print(line)


def _wire_sidebar(ipython: Any, session: Any) -> None:
    """The kernel's one sidebar (made at the first `%load_ext`) shows this session's store and cluster."""
    global _sidebar
    from jupyter_dist.cluster.status import add_status_listener
    from jupyter_dist.ui import sidebar

    if _sidebar is None:
        _sidebar = sidebar.Sidebar(session.store)
    _sidebar.attach(session.store, session.control())
    sidebar.register(ipython, _sidebar)
    add_status_listener(session.cluster, _sidebar.notify_status)


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
