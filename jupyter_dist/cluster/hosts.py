"""Engines on other hosts: addresses, the MPI host file, mpiexec's arguments and the ssh command.

`--hosts h1,h2` (or `--hostfile`) starts one node per host under one `mpiexec`, whose launcher
(PRRTE) starts its daemons on the other hosts over ssh, so every engine is in one MPI world.
The kernel-side pieces here are pure, except `controller_address` and `interface_prefixlen`, which
ask this host's routing table and interfaces (no packet is sent). What a node's first engine reports
once the engines are up comes from `engine.node_probe.node_view`.
"""

from __future__ import annotations

import ipaddress
import shlex
import socket
from collections.abc import Iterable, Mapping
from typing import Any

import psutil
from IPython.core.error import UsageError

from jupyter_dist.common.hosts import is_ip, is_local_host, source_address

# The command PRRTE starts its remote daemons with (`plm_ssh_agent`), e.g. "ssh -F ~/cluster.conf".
SSH_ENV = "JUPYTER_DIST_SSH"
# The kernel-side address the engines connect to, where the routing table's choice is not it (NAT).
CONTROLLER_IP_ENV = "JUPYTER_DIST_CONTROLLER_IP"
# Variables every remote rank needs from the kernel side (PRRTE forwards OMPI_*/PRTE_*/PMIX_* itself).
FORWARD_ENV: tuple[str, ...] = ("IPP_CONNECTION_INFO", "PYTHONUNBUFFERED")

# ... and what they need when the kernel has it: its import path (as Slurm's --export=ALL passes it)
PATH_ENV: tuple[str, ...] = ("PYTHONPATH",)


def forwarded_paths(env: Mapping[str, str]) -> dict[str, str]:
    """The kernel's `PATH_ENV` variables that are set, for the engines on other hosts."""
    return {k: env[k] for k in PATH_ENV if env.get(k)}


def has_remote(hosts: Iterable[str]) -> bool:
    """Whether any node is on another host (else the single-host path: loopback, shared memory)."""
    return any(not is_local_host(h) for h in hosts)


def hostfile_text(hosts: Iterable[str], procs_per_node: int) -> str:
    """An Open MPI host file: one line per distinct host, in node order, `slots` = its ranks.

    With `--map-by slot` ranks fill the first host's slots, then the next: rank // procs_per_node
    is the node, as the layout says. A host named twice gets both nodes' slots on one line.
    """
    slots: dict[str, int] = {}
    for h in hosts:
        slots[h] = slots.get(h, 0) + procs_per_node
    return "".join(f"{h} slots={n}\n" for h, n in slots.items())


def mpiexec_host_args(
    hostfile: str, *, prefix: str, ssh: str | None = None, forward: Iterable[str] = FORWARD_ENV
) -> list[str]:
    """mpiexec arguments for engines on the hosts of `hostfile`.

    `--prefix` makes the remote daemons find `prted` and Open MPI's libraries at the same path
    as here (non-interactive ssh shells rarely have the virtualenv on PATH). `ssh`, when given,
    replaces PRRTE's default agent ("ssh : rsh"); otherwise ssh and ~/.ssh/config work as usual.
    """
    args = ["--hostfile", hostfile, "--map-by", "slot", "--prefix", prefix]
    if ssh:
        args += ["--mca", "plm_ssh_agent", ssh]
    for name in forward:
        args += ["-x", name]
    return args


def ssh_command(env: Mapping[str, str]) -> str | None:
    """The user's ssh command from $JUPYTER_DIST_SSH, checked; None leaves Open MPI's default."""
    text = (env.get(SSH_ENV) or "").strip()
    if not text:
        return None
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise UsageError(f"${SSH_ENV} cannot be split into words ({e}).") from None
    if not words:
        return None
    # PRRTE reads ':' in plm_ssh_agent as a list of alternatives and splits words on spaces
    if ":" in text or any(" " in w for w in words):
        raise UsageError(f"${SSH_ENV} must be a command and options without ':' or quoted spaces, not {text!r}.")
    return " ".join(words)


def resolve_host(host: str) -> str:
    """`host`'s IPv4 address as this host resolves it (an address is returned as it is)."""
    if is_ip(host):
        return host
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise UsageError(f"--hosts: {host!r} does not resolve to an address from this host.") from None
    return str(infos[0][4][0])


def pick_controller_address(sources: Mapping[str, str], override: str | None = None) -> str:
    """The one kernel-side address every remote host is reached from (`sources`: host -> address).

    The controller listens there only. Hosts reached through different local addresses (two
    networks) have no single such address: the user names it with $JUPYTER_DIST_CONTROLLER_IP.
    """
    if override:
        if not is_ip(override):
            raise UsageError(f"${CONTROLLER_IP_ENV} must be an IP address of this host, not {override!r}.")
        return override
    addrs = sorted(set(sources.values()))
    if not addrs:
        raise UsageError("--hosts names no host other than this one: leave --hosts out to run here.")
    loop = [h for h, a in sources.items() if ipaddress.ip_address(a).is_loopback]
    if loop:
        raise UsageError(f"--hosts: {loop[0]!r} is reached through loopback from here, so it is this host; "
                         "name it by an address the other hosts reach.")
    if len(addrs) > 1:
        seen = ", ".join(f"{h} via {a}" for h, a in sources.items())
        raise UsageError(f"--hosts are reached from this host through different addresses ({seen}): "
                         f"set ${CONTROLLER_IP_ENV} to the address of this host that all of them reach.")
    return addrs[0]


def controller_address(hosts: Iterable[str], env: Mapping[str, str]) -> str:
    """Where the controller listens for engines on `hosts` (never 0.0.0.0, never loopback)."""
    sources = {h: source_address(resolve_host(h)) for h in hosts if not is_local_host(h)}
    return pick_controller_address(sources, env.get(CONTROLLER_IP_ENV))


def interface_prefixlen(addr: str) -> int:
    """The prefix length of the local interface holding `addr` (32/128 when none is found)."""
    for entries in psutil.net_if_addrs().values():
        for e in entries:
            if e.address == addr and e.netmask:
                return ipaddress.ip_network(f"{addr}/{e.netmask}", strict=False).prefixlen
    return 128 if ":" in addr else 32


def include_networks(kernel_addr: str, prefixlen: int, host_addrs: Iterable[str]) -> str:
    """Open MPI `*_if_include` value: the kernel's network, plus each host outside it as /32.

    Each process keeps the interfaces whose address lies in one of these networks, so MPI's
    TCP traffic and PRRTE's out-of-band channel stay on the network that joins the hosts.
    """
    net = ipaddress.ip_network(f"{kernel_addr}/{prefixlen}", strict=False)
    parts = [str(net)]
    for a in host_addrs:
        ip = ipaddress.ip_address(a)
        if ip.version == net.version and ip in net:
            continue
        one = str(ipaddress.ip_network(f"{a}/{ip.max_prefixlen}"))
        if one not in parts:
            parts.append(one)
    return ",".join(parts)


def multihost_mpi_env(include: str, kernel_env: Mapping[str, str]) -> dict[str, str]:
    """Open MPI across hosts: TCP (plus self and shared memory) on the joining network only.

    Open MPI's TCP transport still binds its listeners to every address (it has no bind-address
    setting, and btl_tcp_disable_family does not stop the IPv6 one in 5.0). A value the user
    already set in the kernel's environment is left to win.
    """
    want = {
        "OMPI_MCA_btl": "self,sm,tcp",
        "OMPI_MCA_btl_tcp_if_include": include,
        "PRTE_MCA_oob_tcp_if_include": include,
    }
    return {k: v for k, v in want.items() if k not in kernel_env}


def node_plan(views: list[Mapping[str, Any]]) -> tuple[tuple[str, ...], tuple[int, ...], int]:
    """(each node's address, a free port per rank, the master port) from each node's `node_view`."""
    addrs = tuple(str(v["addr"]) for v in views)
    task_ports = tuple(p for v in views for p in v["ports"][1:])
    return addrs, task_ports, int(views[0]["ports"][0])
