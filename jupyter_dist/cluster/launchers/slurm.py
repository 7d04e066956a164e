"""`--launcher slurm`: the engines as one Slurm job, through ipyparallel's Slurm launcher.

The job asks for the layout (`--nodes N --ntasks-per-node P`) and runs Open MPI's `mpiexec` of
this environment inside the allocation: PRRTE reads the node list from Slurm and starts its
daemons on the other nodes with `srun`, so the engines form one MPI world and each engine's
`mpi4py` rank is its run rank (the cluster maps engines by that rank).

Slurm's own variables (`SLURM_NTASKS`, `SLURM_PROCID`, ...) describe the batch step, not the
run, and frameworks read them: Lightning takes `SLURM_NTASKS` to mean "srun started me" and
then reads its ranks from `SLURM_PROCID`. Each engine therefore drops every `SLURM*` variable
before it starts (after `mpiexec` has read the allocation); the job id stays visible as
`JUPYTER_DIST_SLURM_JOB_ID`. The rank environment then comes from the layout alone.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import shlex
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from traitlets import default

from jupyter_dist.cluster.hosts import CONTROLLER_IP_ENV, pick_controller_address
from jupyter_dist.cluster.launchers.mpi import MpiLauncher, require_mpiexec
from jupyter_dist.common.hosts import source_address
from jupyter_dist.plan import validate

# Extra `sbatch` options for every engine job (e.g. "--qos=debug --gres=gpu:4"), for what has no flag.
OPTIONS_VAR = "JUPYTER_DIST_SLURM_OPTIONS"
# Where the controller listens for engines on other nodes, when this host's own choice is wrong.
CONTROLLER_IP_VAR = CONTROLLER_IP_ENV
JOB_ID_VAR = "JUPYTER_DIST_SLURM_JOB_ID"
# Job states after which no engine of the job will register.
_ENDED = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
          "PREEMPTED", "TIMEOUT"}


@dataclass(frozen=True)
class SlurmJob:
    """What the engine job asks Slurm for."""

    nodes: int
    procs_per_node: int
    options: tuple[tuple[str, str], ...] = ()  # ("partition"|"time"|"account", value), from the flags
    extra: tuple[str, ...] = ()  # further `sbatch` options, from $JUPYTER_DIST_SLURM_OPTIONS

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


def job_from(nodes: int, procs_per_node: int, options: tuple[tuple[str, str], ...] = (),
             environ: dict[str, str] | None = None) -> SlurmJob:
    """The job for a layout; options are checked here, so a bad one fails before `sbatch` runs."""
    for key, value in options:
        try:
            validate.slurm_option(key, value)
        except validate.InvalidValue as e:
            raise UsageError(f"{e}.") from None
    raw = (os.environ if environ is None else environ).get(OPTIONS_VAR, "")
    try:
        extra = tuple(shlex.split(raw))
    except ValueError as e:
        raise UsageError(f"${OPTIONS_VAR} is not a valid list of sbatch options ({e}): {raw!r}.") from None
    for opt in extra:
        if not opt.startswith("-") or any(c.isspace() for c in opt):
            raise UsageError(f"${OPTIONS_VAR} holds {opt!r}, which is not an sbatch option (write --name=value, "
                             "without spaces).")
    return SlurmJob(nodes, procs_per_node, tuple(options), extra)


# Each engine starts through this: record the job id, drop Slurm's variables, become the engine.
# ${!SLURM@} lists the names of all variables that start with SLURM (SLURM_*, SLURMD_NODENAME).
ENGINE_WRAPPER = f'export {JOB_ID_VAR}="${{SLURM_JOB_ID:-}}"; unset ${{!SLURM@}}; exec "$@"'


def batch_template(job: SlurmJob, mpiexec: str) -> str:
    """The engine job script as an ipyparallel `batch_template`.

    ipyparallel fills `{n}`, `{cluster_id}`, `{output_file}` and `{program_and_args}`; every
    other brace is doubled. A template of ours means ipyparallel inserts no lines of its own.
    """
    directives = [
        "--job-name=jupyter-dist-{cluster_id}",
        f"--nodes={job.nodes}",
        f"--ntasks-per-node={job.procs_per_node}",
        "--ntasks={n}",
        "--output={output_file}",
        "--export=ALL",
        *(f"--{key}={value}" for key, value in job.options),
        *(_brace(opt) for opt in job.extra),
    ]
    wrapper = _brace(shlex.quote(ENGINE_WRAPPER))
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {d}" for d in directives),
        "# jupyter-dist engines: one MPI world over the allocation; Open MPI reads the node list from Slurm.",
        "set -eu",
        f"exec {_brace(shlex.quote(mpiexec))} -n {{n}} --map-by ppr:{job.procs_per_node}:node --bind-to none \\",
        f"    bash -c {wrapper} jupyter-dist-engine {{program_and_args}}",
        "",
    ]
    return "\n".join(lines)


def _brace(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def engine_env(job: SlurmJob, base: dict[str, str]) -> dict[str, str]:
    """The environment `sbatch` passes on (`--export=ALL`): Open MPI's settings for the job."""
    env = dict(base)
    if job.nodes > 1:
        env.pop("OMPI_MCA_btl", None)  # shared memory alone cannot reach the other nodes
    env["PYTHONUNBUFFERED"] = "1"
    return env


@functools.cache
def slurm_engine_launcher() -> type:
    """ipyparallel's Slurm engine launcher, subclassed on first use: ipyparallel loads in about 0.1 s,
    which `%load_ext` should not pay for a launcher most kernels never use."""
    from ipyparallel.cluster.launcher import SlurmEngineSetLauncher  # heavy: on the first Slurm run

    class JupyterDistSlurmLauncher(SlurmEngineSetLauncher):
        """ipyparallel's Slurm engine launcher, with `sbatch`'s own error message and the job's end noticed.

        The engines run under MPI (`ipengine --mpi`), so each reports its MPI rank.
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # the job script beside the engine log in the (owner-only) profile, not in the notebook's folder
            self.batch_file = os.path.join(self.profile_dir, self.batch_file_name)

        @default("program")
        def _default_program(self) -> list[str]:
            return [*self.engine_cmd, "--mpi"]

        def _run_command(self, command: list[str], **kwargs: Any) -> str:
            done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False, **kwargs)
            if done.returncode != 0:
                said = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
                raise RuntimeError(f"{command[0]} failed: {said}")
            return done.stdout

        def start(self, n: int = 1) -> str:
            job_id = super().start(n)
            threading.Thread(target=self._watch, args=(job_id,), daemon=True, name=f"slurm-job-{job_id}").start()
            return job_id

        def _watch(self, job_id: str) -> None:
            """Mark the engine set stopped once the job has ended (the cluster then stops waiting).

            Every second while the engines start, then every 30 s, to spare slurmctld.
            """
            t0 = time.monotonic()
            while self.state == "running":
                time.sleep(1.0 if time.monotonic() - t0 < 300 else 30.0)
                state = job_state(job_id)
                if state is not None and state.split()[0] in _ENDED:
                    self._job_state = state
                    self.notify_stop({"job_id": job_id, "state": state, "exit_code": 0 if state == "COMPLETED" else 1})
                    return

        def get_output(self, remove: bool = False) -> str:
            """The job's output file as it is now (read afresh each time, never removed: it is the engine log)."""
            out = ""
            with contextlib.suppress(OSError), open(self.output_file, errors="replace") as f:
                out = f.read()
            state = getattr(self, "_job_state", None) or (job_state(self.job_id) if self.job_id else None)
            if state:
                out += f"\n[slurm job {self.job_id}: {state}]\n"
            return out

        def stop(self) -> str:
            if not self.job_id or self.state == "after":
                return ""
            return super().stop()

    return JupyterDistSlurmLauncher


def job_state(job_id: str) -> str | None:
    """`STATE` (and the reason while pending) of a job, from `squeue`, else `scontrol`; None if unknown."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"], capture_output=True, text=True,
                             timeout=20, check=False).stdout.strip()
        if out:
            state, _, reason = out.partition(" ")
            return state if reason in ("", "None") else f"{state} ({reason})"
        out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True,
                             timeout=20, check=False).stdout
        for word in out.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
    return None


def node_addresses(partition: str | None = None) -> dict[str, str]:
    """Each node Slurm may give a job (of `partition`, else of every partition) -> its `NodeAddr`,
    the address slurmctld itself reaches it at (a node name need not resolve on the login host)."""
    cmd = ["sinfo", "-N", "-h", "-o", "%N %o"] + (["-p", partition] if partition else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout
    nodes: dict[str, str] = {}
    for line in out.splitlines():
        words = line.split()
        if len(words) >= 2:
            nodes[words[0]] = words[1]
    return nodes


def _node_ip(name: str, addr: str) -> str:
    """The IPv4 address of a node's NodeAddr (an address, or a name this host resolves)."""
    for candidate in (addr, name):
        with contextlib.suppress(ValueError):
            return str(ipaddress.ip_address(candidate))
        with contextlib.suppress(OSError, UnicodeError):
            return socket.gethostbyname(candidate)
    raise OSError(f"neither {addr!r} nor {name!r} resolves here")


def job_controller_ip(job: SlurmJob, environ: dict[str, str] | None = None) -> str:
    """Where the controller listens: $JUPYTER_DIST_CONTROLLER_IP if set; loopback when every node
    Slurm may give the job is this host; else the one address this host reaches those nodes from."""
    env = os.environ if environ is None else environ
    override = env.get(CONTROLLER_IP_VAR)
    if override:
        return pick_controller_address({}, override)  # checked as for --hosts
    here = {socket.gethostname(), socket.gethostname().split(".")[0], socket.getfqdn(), "localhost"}
    try:
        others = {n: a for n, a in node_addresses(dict(job.options).get("partition")).items() if n not in here}
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"--launcher slurm: could not list Slurm's nodes with sinfo ({e})") from None
    sources: dict[str, str] = {}
    for node, addr in others.items():
        try:
            sources[node] = source_address(_node_ip(node, addr))
        except OSError as e:
            raise RuntimeError(f"--launcher slurm: no route from this host to Slurm node {node} ({e}); "
                               f"set {CONTROLLER_IP_VAR} to an address of this host the nodes reach.") from None
    addrs = set(sources.values())
    if all(ipaddress.ip_address(a).is_loopback for a in addrs):  # also when there are none
        return "127.0.0.1"
    if len(addrs) > 1:
        seen = ", ".join(f"{n} via {a}" for n, a in sources.items())
        raise UsageError(f"--launcher slurm: this host reaches Slurm's nodes through different addresses ({seen}): "
                         f"set ${CONTROLLER_IP_VAR} to the one they all reach.")
    return addrs.pop()


class SlurmLauncher(MpiLauncher):
    """The engines as one Slurm job: one MPI world, mapped by MPI rank as under `--launcher mpi`."""

    name = "slurm"
    engines = "local"  # replaced by `slurm_engine_launcher()` in `configure`

    def job(self) -> SlurmJob:
        """The shape's Slurm job; its options are checked on the way."""
        nodes = self.shape.slurm_nodes or 1
        return job_from(nodes, self.shape.world_size // nodes, self.shape.slurm)

    def check(self, family: str = "") -> None:
        self.job()  # a bad option fails here, not at sbatch

    @property
    def remote(self) -> bool:
        return False  # Slurm places the nodes; `configure` picks the controller's address

    def probed_nodes(self) -> int:
        """A job over several nodes: each node's address, fabric and ports are asked of its engines."""
        nodes = self.job().nodes
        return nodes if nodes > 1 else 0

    def configure(self, cluster: Any, profile_dir: Path, controller_ip: str) -> list[str]:
        """The engine launcher becomes `JupyterDistSlurmLauncher`; the controller listens where the job's
        nodes reach this host, not on the loopback `controller_ip` the cluster was made with."""
        env, notes = self.mpi_env()
        mpiexec = require_mpiexec()
        job = self.job()
        cluster.engine_launcher_class = slurm_engine_launcher()
        cluster.controller_ip = job_controller_ip(job)
        if not ipaddress.ip_address(cluster.controller_ip).is_loopback:
            # one broadcast scheduler: its tree's inner links would listen on loopback
            cluster.controller_args = [*cluster.controller_args, "--IPController.broadcast_scheduler_depth=0"]
        cfg = cluster.config.JupyterDistSlurmLauncher
        cfg.batch_template = batch_template(job, mpiexec)
        cfg.environment = engine_env(job, env)
        # a node without this profile folder (no shared home, a node-local disk): the engine makes it
        cfg.engine_args = ["--IPEngine.auto_create=True"]
        opts = " ".join([*(f"--{k}={v}" for k, v in job.options), *job.extra])
        return [*notes, f"engines as a Slurm job: {job.nodes} node(s) x {job.procs_per_node} task(s)"
                + (f", {opts}" if opts else "") + f"; controller on {cluster.controller_ip}"]

    def watchdog_tokens(self, engine_set: Any) -> list[str]:
        job_id = getattr(engine_set, "job_id", None)
        return [f"slurm:{job_id}"] if job_id else []
