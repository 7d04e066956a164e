"""Host names: the one answer to "is this host the kernel's own" (stdlib only, used on both sides)."""

from __future__ import annotations

import ipaddress
import socket

LOCAL_HOSTS = frozenset({"", "localhost", "127.0.0.1", "::1"})


def is_local_host(host: str) -> bool:
    """`host` names this machine: loopback, an empty name, or this host's own name (short or full)."""
    if host in LOCAL_HOSTS or host == socket.gethostname():
        return True
    # getfqdn asks the resolver (0.03 ms here, far more with a slow DNS): only for names not already known
    return host == socket.getfqdn()


def is_ip(text: str) -> bool:
    """An IPv4 or IPv6 address literal."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def source_address(dest: str) -> str:
    """The local address the routing table uses toward `dest` (a UDP connect sends nothing)."""
    family = socket.AF_INET6 if ":" in dest else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((dest, 9))
        return str(s.getsockname()[0])
