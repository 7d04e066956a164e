"""The JupyterLab sidebar's comm, kernel side.

The sidebar opens a comm to the target ``jupyter_dist`` with a ``hello`` as the open data. The
kernel answers ``welcome`` (protocol version and the allowed choices) and ``state`` (the run
defaults and the cluster status), and pushes a new ``state`` whenever the defaults store or the
cluster status changes. Anything outside the protocol is refused with an ``error`` reply and
logged, never evaluated.

- `protocol`: the wire format (typed messages, their checks, the replies);
- `live`: the kernel's one `Sidebar` (open sessions, cluster control, status snapshot);
- `transport`: the comm target, subshell routing, the hop onto the kernel's main loop.
"""

from __future__ import annotations

from jupyter_dist.ui.sidebar.live import Sidebar, SidebarSession, normalize_status
from jupyter_dist.ui.sidebar.protocol import (
    PROTOCOL_VERSION,
    STOPPED_STATUS,
    TARGET_NAME,
    ProtocolError,
    parse_defaults,
    parse_request,
    welcome,
)
from jupyter_dist.ui.sidebar.transport import register

__all__ = [
    "PROTOCOL_VERSION",
    "STOPPED_STATUS",
    "TARGET_NAME",
    "ProtocolError",
    "Sidebar",
    "SidebarSession",
    "normalize_status",
    "parse_defaults",
    "parse_request",
    "register",
    "welcome",
]
