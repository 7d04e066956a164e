"""Engine side of `-f torchrun`, and (run as `-m`) the wrapper every torchrun worker starts in.

On a node-leader engine, `run(plan, cell)` writes the cell to a script, starts torchrun as a
subprocess in its own session, and prints each line it echoes as the line of the worker's
global rank (`channel.relabel`). A failing worker's error comes from torchrun's error file.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from typing import IO, Any

from jupyter_dist.common.channel import relabel
from jupyter_dist.common.process_group import own_group, read_lines, stop_group
from jupyter_dist.engine import gloo_loop, worker_collectives, workers
from jupyter_dist.engine.frameworks.torchrun_command import AGENT, CELL_SCRIPT, ROLE, torchrun_command
from jupyter_dist.engine.script import run_script

PREFIX = re.compile(rf"^\[{ROLE}(\d+)\]:(.*)$", re.S)  # torchrun's --tee prefix of a worker's line
# What Open MPI's launcher gave the engine: a torchrun worker is not an MPI process, and
# mpi4py imported in one must start as a singleton, not as the engine's rank.
MPI_LAUNCH_VARS = ("PMIX_", "PRTE_", "OMPI_COMM_WORLD_", "OMPI_UNIVERSE_SIZE", "OMPI_FIRST_RANKS",
                   "OMPI_APP_CTX", "OMPI_NUM_APP_CTX", "OMPI_FILE_LOCATION", "OMPI_ARGV", "OMPI_COMMAND",
                   "OMPI_MCA_ess", "OMPI_MCA_pmix", "OMPI_MCA_orte", "OMPI_MCA_prte", "OMPI_MCA_initial_wdir")
# torchrun's own log lines ("W1202 18:53:03.844000 23614 path:line] ..."): held to the end of
# the run, and dropped when a worker's error file says what went wrong
AGENT_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")
STOP_GRACE_S = 3.0  # under the runner's INTERRUPT_GRACE_S, so a stuck torchrun is killed before its engine is given up
_last_dir: dict[str, str] = {}


class TorchrunWorkerError(RuntimeError):
    """A torchrun worker failed; the message names its global rank.

    The engine's IPython renders it with `_render_traceback_`: the worker's own traceback (from
    its error file), not this agent's frame or the `__jupyter_dist__.run_torchrun(...)` line that started it.
    """

    def __init__(self, message: str, worker_traceback: str = "") -> None:
        super().__init__(message)
        self.worker_traceback = worker_traceback

    def _render_traceback_(self) -> list[str]:
        return [str(self), *self.worker_traceback.rstrip("\n").splitlines()]


class TorchrunStopped(KeyboardInterrupt):
    """This node's torchrun was interrupted (by the user, or because a peer failed) and stopped."""

    def _render_traceback_(self) -> list[str]:
        return [f"KeyboardInterrupt: {self}"]


def worker_env(env: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    out = {k: v for k, v in env.items() if not k.startswith(MPI_LAUNCH_VARS)}
    out["PYTHONUNBUFFERED"] = "1"  # worker output goes to files that torchrun tails
    return out


def run(plan: dict[str, Any], cell: str | None) -> None:
    """Launch this node's torchrun over `cell` (or `plan["script"]`) and wait for it."""
    node = int(os.environ["NODE_RANK"])
    procs = int(plan["nproc_per_node"])
    # a process group of an earlier -f pytorch run is gone (set-up hook release_torch_group); if
    # its store still held the master port, the notebook chose another (Torchrun.before_layout)
    work = _fresh_dir()
    script = plan["script"]
    if script is None:
        script = os.path.join(work, CELL_SCRIPT)
        with open(script, "w") as f:
            f.write(cell or "")
    log_dir = os.path.join(work, "logs")
    cmd = torchrun_command(plan, node, script, python=sys.executable, log_dir=log_dir)
    env = {**worker_env(os.environ), **worker_collectives.env_for_workers()}  # workers answer for their collectives
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            **own_group())  # a group of its own (to stop it whole), in this session
    echo = Echo(node * procs)
    workers.watch(proc.pid, AGENT)  # its workers' resources and stacks are their ranks' (engine/workers.py)
    try:
        _stream(proc, echo)
        code = proc.wait()
    except BaseException as e:
        stop_group(proc, STOP_GRACE_S)  # interrupted (by the user, or because a peer failed): torchrun's logs are dropped
        if isinstance(e, KeyboardInterrupt):
            raise TorchrunStopped(f"torchrun on node {node} was stopped, with its workers") from None
        raise
    finally:
        workers.forget(proc.pid)
    if code == 0:
        echo.release()
    else:
        message, found = failure_message(log_dir, echo.agent_lines, node, procs, code)
        if not found:
            echo.release()  # no error file: torchrun's own report is the best account
        raise TorchrunWorkerError(message, worker_traceback(log_dir) if found else "") from None


def _fresh_dir() -> str:
    """A new directory for this run's script and logs; the previous run's is removed."""
    old = _last_dir.pop("path", None)
    if old:
        shutil.rmtree(old, ignore_errors=True)
    path = tempfile.mkdtemp(prefix="jupyter-dist-torchrun-")
    _last_dir["path"] = path
    return path


class Echo:
    """Prints torchrun's lines as they come; `[defaultL]:` lines belong to worker L.

    torchrun's own failure report (a traceback of the agent and a summary of what the error
    files say) and its log lines are held back: a failed worker's error is shown from its error
    file instead; without one, or when all went well, they are shown at the end.
    """

    def __init__(self, first_rank: int) -> None:
        self.first_rank = first_rank
        self.agent_lines: list[str] = []
        self.held: list[tuple[IO[str], str]] = []
        self.failing = False  # torchrun's failure report has begun

    def line(self, line: str, sink: IO[str]) -> None:
        m = PREFIX.match(line)
        if m:
            sink.write(relabel(self.first_rank + int(m.group(1)), m.group(2)) + "\n")
        else:
            self.agent_lines.append(line)
            if self.failing or line.startswith("Traceback (most recent call last)"):
                self.failing = True
                self.held.append((sink, line))
                return
            if AGENT_LOG.match(line):
                self.held.append((sink, line))
                return
            sink.write(line + "\n")
        sink.flush()

    def release(self) -> None:
        for sink, line in self.held:
            sink.write(line + "\n")
            sink.flush()
        self.held = []


def _stream(proc: subprocess.Popen[bytes], echo: Echo) -> None:
    """Read torchrun's stdout and stderr as they come, line by line, until both close."""
    read_lines({proc.stdout: sys.stdout, proc.stderr: sys.stderr}, echo.line)  # type: ignore[dict-item]


def _error_files(log_dir: str) -> list[tuple[int, int, str, str]]:
    """(timestamp, local rank, message, traceback) from each failed worker's error file."""
    errors = []
    for path in glob.glob(os.path.join(log_dir, "**", "error.json"), recursive=True):
        local = os.path.basename(os.path.dirname(path))
        if not local.isdigit():
            continue
        try:
            with open(path) as f:
                msg = json.load(f)["message"]
            text = msg["message"] if isinstance(msg, dict) else str(msg)
            extra = msg.get("extraInfo", {}) if isinstance(msg, dict) else {}
            stamp = int(extra.get("timestamp", 0))
            stack = str(extra.get("py_callstack") or "")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        errors.append((stamp, int(local), text, stack))
    return sorted(errors)


def worker_traceback(log_dir: str) -> str:
    """The first failed worker's traceback, as its error file holds it ("" if none)."""
    errors = _error_files(log_dir)
    return errors[0][3] if errors else ""


def failure_message(log_dir: str, agent_lines: list[str], node: int, procs: int, code: int) -> tuple[str, bool]:
    """The failed workers, the first by time in full, and whether their error files said why; else
    torchrun's summary."""
    errors = _error_files(log_dir)
    if errors:
        _, local, text, _ = errors[0]
        message = f"{_who(node * procs + local, node, local)} failed: {text}"
        # every other failed worker too, by time: a failure of all of them must not read as one's
        others = [f"rank {node * procs + lr} (local rank {lr}): {t.splitlines()[0] if t else 'failed'}"
                  for _, lr, t, _ in errors[1:]]
        if others:
            message += "; then worker " + "; worker ".join(others)
        return message, True
    summary = "\n".join(agent_lines)
    ranks = re.findall(r"rank\s*:\s*(\d+) \(local_rank: (\d+)\)", summary)
    codes = re.findall(r"exitcode\s*:\s*(-?\d+)", summary)
    if ranks:
        rank, local = int(ranks[-1][0]), int(ranks[-1][1])  # the summary ends with the root cause
        how = _exit_text(int(codes[-1])) if codes else "failed"
        return f"{_who(rank, node, local)} {how}; its output is above.", False
    return f"torchrun on node {node} {_exit_text(code)}; its output is above.", False


def _who(rank: int, node: int, local: int) -> str:
    return f"torchrun worker rank {rank} (node {node}, local rank {local})"


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def worker_main(argv: list[str]) -> None:
    """In a torchrun worker: run the script as `__main__`; on an error, show its traceback from
    the script's own frames on, and leave it in torchrun's error file for the agent."""
    script, *args = argv
    worker_collectives.serve()  # its collectives recorded, and answered for on its engine's asking
    gloo_loop.install()  # gloo's loop threads behind the training on a crowded node (engine/gloo_loop.py)
    for stream in (sys.stdout, sys.stderr):  # one write per line: torchrun's tee reads the files by line,
        with contextlib.suppress(AttributeError, ValueError):  # and a line written in pieces came out split
            stream.reconfigure(line_buffering=True, write_through=False)
    try:
        run_script(script, args)
        _destroy_group()
    except SystemExit:
        _destroy_group()
        raise
    except BaseException as e:
        te = traceback.TracebackException.from_exception(e)
        frames = list(te.stack)
        first = next((i for i, f in enumerate(frames) if f.filename == script), 0)
        te.stack = traceback.StackSummary.from_list(frames[first:])
        shown = "".join(te.format())
        sys.stderr.write(shown)
        sys.stderr.flush()
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        handler = ErrorHandler()
        handler.record_exception(e)
        _trim_error_file(handler._get_error_file_path(), shown)
        sys.exit(1)


def _destroy_group() -> None:
    """The script's process group destroyed before the worker exits, as torch asks: left to the
    interpreter's exit, gloo's threads were torn down mid-exit now and then on a loaded machine
    ("terminate called without an active exception", SIGABRT, and the agents' exit barrier failing)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _trim_error_file(path: str | None, shown: str) -> None:
    """Put the traceback from the script's frames on (not this wrapper's) in the error file."""
    if not path:
        return
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        with open(path) as f:
            data = json.load(f)
        data["message"]["extraInfo"]["py_callstack"] = shown
        with open(path, "w") as f:
            json.dump(data, f)


if __name__ == "__main__":
    worker_main(sys.argv[1:])
