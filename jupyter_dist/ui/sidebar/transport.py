"""The sidebar's comm in the kernel: the target, one `SidebarSession` per comm, the thread hops.

The frontend opens its comm on a kernel subshell when the kernel has them (ipykernel 7), so the
sidebar answers while a cell runs on the main shell; replies are routed back to the subshell the
request came from, and cluster actions hop onto the kernel's main loop (`Sidebar.on_main`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from jupyter_dist.plan.defaults import STORE
from jupyter_dist.ui.sidebar.live import Sidebar, SidebarSession
from jupyter_dist.ui.sidebar.protocol import TARGET_NAME, welcome

log = logging.getLogger(__name__)


def pin_routing(comm: Any) -> None:
    # ipykernel 7 routes a comm_msg to the subshell of the last message this comm *sent*, so
    # a state pushed from the main shell (by a running %%distrun cell) would send the sidebar's
    # next request to the busy main shell. Route by the request's own subshell_id instead.
    if hasattr(comm, "_reply_subshell_for"):
        comm._reply_subshell_for = lambda _data, default: default


def open_comm(sidebar: Sidebar, comm: Any, open_msg: dict[str, Any]) -> None:
    """The comm target's handler: a session for this comm, fed its open data and its messages."""
    pin_routing(comm)
    key = str(comm.comm_id)
    session = SidebarSession(sidebar, comm.send)
    sidebar.add_session(key, session)
    comm.on_msg(lambda msg: session.handle(msg.get("content", {}).get("data")))
    comm.on_close(lambda _msg: sidebar.drop_session(key))
    data = open_msg.get("content", {}).get("data")
    if data:
        session.handle(data)


def call_on_loop(loop: Any, fn: Callable[[], None]) -> None:
    if threading.current_thread() is threading.main_thread():
        fn()
    else:
        loop.add_callback(fn)


def announce() -> None:
    """Tell frontends already attached to this kernel that the target now exists."""
    try:
        import comm as comm_package  # ipykernel's comm factory; absent in a plain IPython

        announcement = comm_package.create_comm(target_name=TARGET_NAME, data=dict(welcome()))
        announcement.close()
    except Exception:
        log.debug("could not announce the sidebar target", exc_info=True)


def register(ipython: object | None, sidebar: Sidebar | None = None) -> Sidebar | None:
    """Register the comm target on the kernel behind `ipython`, served by `sidebar` (by default one
    on the run defaults' store); returns it, or None (and nothing done) without a kernel."""
    kernel = getattr(ipython, "kernel", None)
    manager = getattr(kernel, "comm_manager", None)
    if manager is None:
        return None
    sidebar = sidebar if sidebar is not None else Sidebar(STORE)
    manager.register_target(TARGET_NAME, partial(open_comm, sidebar))
    loop = getattr(kernel, "io_loop", None)
    if loop is not None:
        sidebar.on_main = partial(call_on_loop, loop)
    sidebar.follow_store()
    announce()
    return sidebar
