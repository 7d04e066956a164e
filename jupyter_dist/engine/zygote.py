"""A node's engine fork server ("zygote"): the engine stack imported once, an engine forked per rank.

On 2 cores a rank's start is CPU-bound: each engine imports python, ipykernel, ipyparallel, zmq,
tornado and IPython (and torch for a torch framework), about 1-1.5 s of CPU each. Started by the
kernel (`cluster/zygote.py`) before mpiexec, this process imports them once, then listens on a unix
socket. mpiexec starts a stub per rank (`engine/zygote_stub.py`) that sends its arguments,
environment, working folder and fds 0/1/2; the server forks, and the child becomes the engine
exactly as `ipengine ARGS` would (MPI_Init included, with the stub's PMIx environment). The server
is the engines' parent: it tells each stub how its engine ended, kills an engine whose stub went
away, and exits (killing its engines) once the kernel that started it is gone.

Nothing that starts a thread, MPI or CUDA is imported before a fork: not mpi4py.MPI.

    python -m jupyter_dist.engine.zygote SOCKET PARENT_PID [--run MODULE] MODULE...
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import random
import runpy
import selectors
import signal
import socket
import struct
import sys
import threading

from jupyter_dist.engine.zygote_stub import recv_msg, send_msg

ENGINE_MODULES = ("zmq", "tornado.ioloop", "IPython", "ipykernel.ipkernel", "ipyparallel.engine.app",
                  "jupyter_dist.engine.setup", "jupyter_dist.engine.agent", "jupyter_dist.engine.preload")
_PR_SET_PDEATHSIG = 1
ENGINE = "ipyparallel.engine"  # what ipyparallel runs as `python -m ipyparallel.engine` (ipengine)


def preimport(names: list[str]) -> None:
    """Import the engine stack and `names`; a module that fails is left to the engine to import."""
    for name in (*ENGINE_MODULES, *names):
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    if threading.active_count() > 1:  # a thread would not survive the fork: say so, then fork anyway
        sys.stderr.write(f"jupyter-dist zygote: threads before fork: {threading.enumerate()}\n")


def _die_with_parent(sig: int) -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


def become_engine(request: dict, fds: list[int], run: str = ENGINE) -> None:
    """In the forked child: the stub's process state, then ipyparallel's engine; never returns."""
    code = 1
    try:
        os.setpgid(0, 0)  # a group of its own, in the server's session (cluster/zygote.py start)
        _die_with_parent(signal.SIGKILL)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as python starts: a broken pipe is an EPIPE, not a death
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        random.seed()
        sys.argv = [run, *request["argv"]]
        code = 0
        try:
            runpy.run_module(run, run_name="__main__", alter_sys=True)  # as `python -m ipyparallel.engine`
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001 - as python would: the traceback, then exit status 1
            import traceback  # the child's last act

            traceback.print_exc()
            code = 1
        with contextlib.suppress(BaseException):
            import atexit  # the engine's own atexit handlers, as at a normal interpreter exit

            atexit._run_exitfuncs()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


class Zygote:
    """The accept / fork / reap loop (single-threaded: only so is forking safe)."""

    def __init__(self, path: str, parent: int, run: str = ENGINE) -> None:
        self.parent, self.run = parent, run
        self.sel = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.listener.bind(path)
        os.chmod(path, 0o600)
        self.listener.listen(128)
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        self.children: dict[int, socket.socket] = {}  # engine pid -> its stub's connection

    def serve(self) -> None:
        while os.getppid() == self.parent:
            for key, _ in self.sel.select(timeout=1.0):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(OSError):
                        os.read(self.wake_r, 4096)
                else:
                    self._stub_event(key.data, key.fileobj)
            self._reap()
        self.shutdown()

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            msg, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
            request = self._whole_request(conn, msg)
        except (OSError, ValueError, EOFError):
            conn.close()
            return
        pid = os.fork()
        if pid == 0:
            self.listener.close()
            for other in self.children.values():
                other.close()
            signal.set_wakeup_fd(-1)
            become_engine(request, fds, self.run)
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        self.sel.register(conn, selectors.EVENT_READ, pid)
        with contextlib.suppress(OSError):
            send_msg(conn, {"pid": pid})

    @staticmethod
    def _whole_request(conn: socket.socket, first: bytes) -> dict:
        """The stub's request: `first` holds its start (read with the fds), the rest is read here."""
        head = struct.Struct("!I")
        while len(first) < head.size:
            first += conn.recv(head.size - len(first)) or b""
        (n,) = head.unpack(first[: head.size])
        body = first[head.size :]
        while len(body) < n:
            chunk = conn.recv(n - len(body))
            if not chunk:
                raise EOFError("stub closed")
            body += chunk
        return json.loads(body)

    def _stub_event(self, pid: int, conn: socket.socket) -> None:
        """A stub's connection is readable: it only closes (the stub died): its engine is killed."""
        try:
            recv_msg(conn)
        except (EOFError, OSError, ValueError):
            self.sel.unregister(conn)
            sys.stdout.write(f"engine {pid}: its stub went away; killed\n")
            sys.stdout.flush()
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
            ended = {"signal": sig} if sig else {"code": os.waitstatus_to_exitcode(status)}
            sys.stdout.write(f"engine {pid} ended: {ended}\n")  # the server's log (cluster/zygote.py)
            sys.stdout.flush()
            with contextlib.suppress(OSError):
                send_msg(conn, ended)
            with contextlib.suppress(Exception):
                self.sel.unregister(conn)
            conn.close()

    def shutdown(self) -> None:
        """The kernel is gone: every engine forked here is killed, then this process exits."""
        for pid in list(self.children):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for pid in list(self.children):
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
        self._reap()


def main(argv: list[str]) -> None:
    path, parent, modules = argv[1], int(argv[2]), argv[3:]
    run = ENGINE
    if modules[:1] == ["--run"]:  # another module in place of the engine (the protocol's tests)
        run, modules = modules[1], modules[2:]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the kernel's interrupts are not the server's
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    preimport(modules)
    server = Zygote(path, parent, run)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    try:
        server.serve()
    finally:
        server.shutdown()


if __name__ == "__main__":
    main(sys.argv)
