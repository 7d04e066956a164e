"""Engine-side half of jupyter-dist: imported on every engine, never in the notebook's hot path.

Functions here are sent by reference (`view.apply(engine.setup, ...)`), so they must stay
importable and cheap to import: torch and friends are imported only by the hooks that need them.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import socket
import sys
from typing import Any

_MISSING = object()

# Lines a rank prints that start with RELABEL + "<rank>" + RELABEL are shown as that rank's
# output: a torchrun agent on a node leader uses it to attribute its workers' lines.
RELABEL = "\x1e"

# Data a rank sends to the notebook rides on a display message of this type: it arrives in
# order with the rank's output and costs no round trip. The notebook routes it to the view.
DATA_MIME = "application/vnd.jupyter-dist.data+json"

# rank given by the notebook side; environment keys this package manages and their originals
_state: dict[str, Any] = {"rank": None, "saved": {}, "framework": None}


def identify() -> dict[str, Any]:
    """Who this engine is: its MPI rank when run under MPI (mpi4py already imported by the engine)."""
    mpi_rank = mpi_size = None
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None:
        mpi_rank, mpi_size = mpi.COMM_WORLD.Get_rank(), mpi.COMM_WORLD.Get_size()
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "mpi_rank": mpi_rank,
        "mpi_size": mpi_size,
        "cpu_count": os.cpu_count() or 1,
        "env_keys": sorted(os.environ),
    }


def my_rank() -> int:
    rank = _state["rank"]
    if rank is None:
        raise RuntimeError("jupyter-dist: this engine was given no rank yet")
    return rank


def apply_env(env: dict[str, str]) -> None:
    """Set `env`; keys set by an earlier run but absent now get their inherited values back."""
    saved: dict[str, Any] = _state["saved"]
    for key in list(saved):
        if key not in env:
            original = saved.pop(key)
            if original is _MISSING or original is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = original
    for key, value in env.items():
        if key not in saved:
            saved[key] = os.environ.get(key)
        os.environ[key] = value


def setup(envs_by_rank: dict[int, dict[str, str]], hooks: tuple[str, ...] = (), cwd: str | None = None) -> dict[str, Any]:
    """Apply this rank's environment and the framework's hooks; one round trip per change."""
    rank = my_rank()
    apply_env(envs_by_rank[rank])
    if cwd and os.path.isdir(cwd) and os.getcwd() != cwd:
        os.chdir(cwd)
    if cwd and cwd not in sys.path:
        sys.path.insert(0, cwd)
    for hook in hooks:
        resolve_hook(hook)()
    _sync_torch_threads()
    if not _state.get("frozen"):
        # Once, before any cell ran: the engine's own objects (ipykernel, zmq, ipyparallel, the
        # frameworks' modules) never die, so later collections, which a training loop triggers
        # often, need not scan them. Objects of the user's cells are never frozen.
        gc.freeze()
        _state["frozen"] = True
    return {"rank": rank, "pid": os.getpid()}


def resolve_hook(path: str) -> Any:
    """`"package.module:function"` to the function (framework modules name their engine set-up so)."""
    import importlib

    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _flush_before_dying() -> None:
    """Output printed just before a crash must reach the notebook: flush each finished line at
    once (not every 0.2 s), and flush before `os._exit`."""
    if _state.get("flushing"):
        return
    _state["flushing"] = True
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "flush_interval"):
            stream.flush_interval = 0.02
        _flush_on_newline(stream)
    real_exit = os._exit

    def _exit(code: int) -> None:
        with contextlib.suppress(Exception):
            publish("exit", {"code": int(code)})
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # dying anyway
                stream.flush()
        import time

        time.sleep(0.1)  # let the I/O thread put the exit code and last lines on the wire
        real_exit(code)

    os._exit = _exit


def _flush_on_newline(stream: Any) -> None:
    write = stream.write

    def write_and_flush(text: str) -> int | None:
        n = write(text)
        if "\n" in text:
            stream.flush()
        return n

    with contextlib.suppress(AttributeError, TypeError):
        stream.write = write_and_flush


def stack_file(stack_dir: str, rank: int) -> str:
    return os.path.join(stack_dir, f"stack-rank-{rank}.txt")


def assign_rank(rank: int, stack_dir: str) -> None:
    """Take `rank`, and arm SIGUSR1 to dump all Python stacks to this rank's stack file."""
    import faulthandler
    import signal

    _state["rank"] = rank
    _watch_cells()
    _flush_before_dying()
    path = stack_file(stack_dir, rank)
    os.makedirs(stack_dir, mode=0o700, exist_ok=True)
    old = _state.get("stack_fh")
    if old is not None:
        old.close()
    fh = open(path, "w")  # noqa: SIM115 - kept open for the signal handler
    os.chmod(path, 0o600)
    _state["stack_fh"] = fh
    faulthandler.register(signal.SIGUSR1, file=fh, all_threads=True)
    crash = open(crash_file(stack_dir, rank), "w")  # noqa: SIM115 - kept open for faulthandler
    os.chmod(crash.name, 0o600)
    _state["crash_fh"] = crash
    faulthandler.enable(file=crash, all_threads=True)  # SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL


def _sync_torch_threads() -> None:
    """OMP_NUM_THREADS is read once at torch import; a warm engine needs it applied by hand."""
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS")
    if torch is not None and threads and threads.isdigit():
        torch.set_num_threads(int(threads))


def cuda_set_device() -> None:
    """NCCL: bind this rank to GPU LOCAL_RANK before any process group exists."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def torch_idempotent_init() -> None:
    """Make `init_process_group` a no-op when a group of the same world already exists.

    A cell written for torchrun calls it unconditionally; re-running that cell on warm
    engines must not fail. A different world (size, rank, master) replaces the old group.
    """
    import torch.distributed as dist

    if getattr(dist.init_process_group, "_jupyter_dist", False):
        return
    original = dist.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        want = _wanted_world(args, kwargs)
        if dist.is_initialized():
            have = _state.get("torch_world")
            if have == want:
                return None
            dist.destroy_process_group()
        if want[0] == "nccl" or os.environ.get("JUPYTER_DIST_BACKEND") == "nccl":
            cuda_set_device()
        result = original(*args, **kwargs)
        _state["torch_world"] = want
        return result

    init_process_group._jupyter_dist = True  # type: ignore[attr-defined]
    init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    init_process_group.__doc__ = original.__doc__
    dist.init_process_group = init_process_group
    from jupyter_dist.engine.cells import END_OF_CELL, add_hook

    add_hook(END_OF_CELL, torch_group_gone)


def torch_group_gone() -> tuple[str, Any] | None:
    """End-of-cell hook: tell the notebook when the cell destroyed the group it had made.

    A cell written for torchrun ends with `destroy_process_group()`. Run again on the same
    warm engines with the same MASTER_PORT, the new group's first collective hung (see
    docs/reliability.md); with a new port it does not. The notebook takes a new master port
    for the next run when it gets `GROUP_GONE`.
    """
    if _state.get("torch_world") is None:
        return None
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return None
    _state.pop("torch_world", None)
    return GROUP_GONE, True


def _wanted_world(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    backend = kwargs.get("backend", args[0] if args else None)
    env = os.environ
    return (
        str(backend).lower() if backend is not None else None,
        kwargs.get("world_size", env.get("WORLD_SIZE")),
        kwargs.get("rank", env.get("RANK")),
        env.get("MASTER_ADDR"),
        env.get("MASTER_PORT"),
        kwargs.get("init_method"),
    )


def crash_file(stack_dir: str, rank: int) -> str:
    return os.path.join(stack_dir, f"crash-rank-{rank}.txt")


def read_crash(stack_dir: str, rank: int) -> str:
    """What faulthandler wrote when `rank` crashed (empty if it did not)."""
    try:
        with open(crash_file(stack_dir, rank)) as f:
            return f.read()
    except OSError:
        return ""


def read_stack(stack_dir: str, rank: int) -> str:
    """The last stack dump of `rank` (read in the notebook for ranks on this host)."""
    try:
        with open(stack_file(stack_dir, rank)) as f:
            return f.read()
    except OSError:
        return ""


def release_torch_group() -> None:
    """Set-up hook of -f torchrun: a group that an earlier -f pytorch run left on these engines is
    destroyed on every rank alike, so that a later -f pytorch run makes a fresh one everywhere
    (a group gone on some ranks only would leave the others talking to closed pairs)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    _state.pop("torch_world", None)


def abort_collectives(protected_ports: tuple[int, ...] = ()) -> int:
    """Release this rank's peers from a collective after it failed; returns sockets shut.

    Neither destroying a gloo group nor aborting it closes its TCP pairs while a failed
    collective's traceback still holds them, and a peer blocked in that collective waits
    for its (30 minute) timeout. Shutting this rank's established TCP connections (all but
    those to the ipyparallel controller, `protected_ports`) makes every peer's collective
    fail at once with "connection closed by peer"; the group is replaced on the next
    `init_process_group`.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return 0
    import gc

    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    _state.pop("torch_world", None)
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            setattr(sys, name, None)
    gc.collect()
    return _shut_peer_sockets(set(protected_ports))


def _shut_peer_sockets(protected: set[int]) -> int:
    import psutil

    shut = 0
    for conn in psutil.Process().net_connections(kind="tcp"):
        if conn.status != psutil.CONN_ESTABLISHED or not conn.raddr or conn.fd < 0:
            continue
        if conn.raddr.port in protected:
            continue
        with contextlib.suppress(OSError):
            sock = socket.socket(fileno=os.dup(conn.fd))
            try:
                sock.shutdown(socket.SHUT_RDWR)
                shut += 1
            finally:
                sock.close()
    return shut


def fetch_user(name: str) -> tuple[str, Any]:
    """`-o NAME`: ('ok', value), ('missing', None) or ('unsendable', reason)."""
    from IPython import get_ipython

    shell = get_ipython()
    namespace = shell.user_ns if shell is not None else {}
    value = namespace.get(name, _MISSING)
    if value is _MISSING:
        return ("missing", None)
    try:
        pickle.dumps(value)
    except Exception as e:  # noqa: BLE001 - any pickling failure is reported, not raised
        return ("unsendable", f"{type(e).__name__}: {e}")
    return ("ok", value)


RANK_VARS = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def expand_rank_vars(arg: str, env: dict[str, str] | os._Environ[str] | None = None) -> str:
    """`$RANK`, `${LOCAL_RANK}`, ... from this rank's environment; anything else untouched."""
    env = os.environ if env is None else env
    for name in RANK_VARS:  # longest names first, so $RANK does not eat $RANK_X
        value = env.get(name)
        if value is None:
            continue
        arg = arg.replace("${" + name + "}", value)
        arg = _replace_bare(arg, name, value)
    return arg


def _replace_bare(arg: str, name: str, value: str) -> str:
    import re

    return re.sub(r"\$" + name + r"(?![A-Za-z0-9_])", value, arg)


def run_script(path: str, args: list[str]) -> None:
    """Script mode: run `path` as `__main__` with this rank's expanded arguments."""
    import runpy

    argv = [path, *(expand_rank_vars(a) for a in args)]
    old_argv = sys.argv
    sys.argv = argv
    script_dir = os.path.dirname(path)
    sys.path.insert(0, script_dir)
    try:
        runpy.run_path(path, run_name="__main__")
    finally:
        sys.argv = old_argv
        if sys.path and sys.path[0] == script_dir:
            sys.path.pop(0)


def relabel(rank: int, line: str) -> str:
    return f"{RELABEL}{rank}{RELABEL}{line}"


GROUP_GONE = "torch_group_gone"  # publish key: the cell destroyed its torch process group


def publish(key: str, data: Any) -> None:
    """Send `data` to the notebook's view of this rank, under `key` (see DATA_MIME)."""
    from IPython.display import publish_display_data

    publish_display_data({DATA_MIME: {"key": key, "data": data}, "text/plain": ""})


def _watch_cells() -> None:
    from IPython import get_ipython

    from jupyter_dist.engine import cells as engine_cells
    engine_cells.watch(get_ipython())
