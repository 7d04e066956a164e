"""One check per value a user can give: counts, hosts, timeouts, choices, Slurm options, env keys.

The `%%distrun` flags, the panel, the sidebar's comm, `%dist export` and the Slurm launcher call
these same functions. Each returns the clean value or raises `InvalidValue` whose message names
the value as the caller named it (`name`: a flag such as `-n`, or a protocol field such as
`procs_per_node`); the caller turns it into its own error type (`UsageError`, `ProtocolError`).
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Iterable

MAX_NODES = 4096
MAX_PROCS_PER_NODE = 1024

# RFC 1123 host names, IPv4 and IPv6 literals; nothing a shell would interpret.
HOST_NAME = re.compile(
    r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\Z"
)
IPV6 = re.compile(r"[0-9A-Fa-f:.]{2,45}\Z")
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
SLURM_OPTIONS: dict[str, re.Pattern[str]] = {
    "partition": re.compile(r"[A-Za-z0-9_.,+-]+\Z"),
    "account": re.compile(r"[A-Za-z0-9_.+-]+\Z"),
    "time": re.compile(r"[0-9][0-9:-]*\Z"),
}


class InvalidValue(ValueError):
    """A value that fails its check; the message is one sentence naming it (no final period)."""


def shown(value: object) -> str:
    """A short, safe rendering of a user's value for an error message."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def count(value: object, name: str, minimum: int = 1, limit: int | None = None) -> int:
    """A whole number in `[minimum, limit]`; text such as `"4"` (a flag's value) is read as one."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            number = None
    if number is None or number < minimum or (limit is not None and number > limit):
        bound = f"from {minimum} to {limit}" if limit is not None else f"of at least {minimum}"
        raise InvalidValue(f"{name} must be a whole number {bound}, not {shown(value)}")
    return number


def choice(value: object, name: str, choices: Iterable[str]) -> str:
    options = tuple(choices)
    text = value.strip().lower() if isinstance(value, str) else None
    if text not in options:
        raise InvalidValue(f"{name} must be one of {', '.join(options)}, not {shown(value)}")
    return text


def is_host(value: str) -> bool:
    """A host name, an IPv4 or an IPv6 address."""
    if ":" in value and IPV6.match(value):
        try:
            ipaddress.IPv6Address(value)
        except ValueError:
            return False
        return True
    if re.fullmatch(r"[\d.]+", value):  # digits and dots only: an IPv4 address or nothing
        try:
            ipaddress.IPv4Address(value)
        except ValueError:
            return False
        return True
    return bool(HOST_NAME.match(value))


def host(value: object, name: str = "--hosts") -> str:
    text = value.strip() if isinstance(value, str) else None
    if not text or not is_host(text):
        raise InvalidValue(f"{name}: {shown(value)} is not a valid host name or address")
    return text


def hosts(values: object, name: str = "--hosts") -> tuple[str, ...]:
    """A list of hosts (at most `MAX_NODES`), each checked by `host`."""
    if isinstance(values, str):
        values = [h for h in values.split(",") if h.strip()]
    if not isinstance(values, list | tuple) or len(values) > MAX_NODES:
        raise InvalidValue(f"{name} must be a list of at most {MAX_NODES} host names")
    return tuple(host(h, name) for h in values)


def timeout(value: object, name: str = "--timeout") -> float | None:
    """Seconds before a run is declared hung: a positive finite number, or None for none."""
    if value is None:
        return None
    number = math.nan
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = math.nan
    if not math.isfinite(number) or number <= 0:
        raise InvalidValue(f"{name} must be a positive number of seconds, not {shown(value)}")
    return number


def slurm_option(key: str, value: str) -> str:
    """A Slurm option jupyter-dist passes on (`--partition`, `--time`, `--account`)."""
    pattern = SLURM_OPTIONS.get(key)
    if pattern is None:
        raise InvalidValue(f"--{key} is not a Slurm option jupyter-dist knows ({', '.join(sorted(SLURM_OPTIONS))})")
    if not pattern.match(value):
        raise InvalidValue(f"--{key} {value!r} is not a valid Slurm {key}")
    return value


def env_key(key: str, pair: str) -> str:
    if not ENV_KEY.match(key):
        raise InvalidValue(
            f"--env {pair!r}: {key!r} is not a valid environment variable name "
            "(letters, digits and _, not starting with a digit)"
        )
    return key
