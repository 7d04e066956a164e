"""What mpiexec starts per rank instead of `ipengine` when engines are forked (`engine/zygote.py`).

Run as a file (`python -I -S zygote_stub.py SOCKET ARGS...`): the standard library only, a few
milliseconds. It hands the node's fork server its arguments, environment (mpiexec's OMPI_*/PMIX_*
included), working folder and fds 0/1/2, forwards the signals it gets to the engine forked for it,
and ends as the engine ended: the same exit code, or killed by the same signal, so that mpiexec
reports a rank's death as it would for an engine it had started itself.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import time

FORWARDED = ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT", "SIGCONT", "SIGABRT")
CONNECT_WAIT = float(os.environ.get("JUPYTER_DIST_ZYGOTE_WAIT", "180"))
# set in a forked engine's environment: its stub's pid. mpiexec's daemon is the stub's parent, not the
# engine's, and a release must know the daemon's ports (engine/faults.py launcher_ports)
STUB_PID_ENV = "JUPYTER_DIST_STUB_PID"
_HEAD = struct.Struct("!I")


def send_msg(sock: socket.socket, obj: object, fds: list[int] | None = None) -> None:
    """One length-prefixed JSON message, with `fds` passed alongside its first bytes."""
    data = json.dumps(obj).encode()
    buf = _HEAD.pack(len(data)) + data
    if fds:
        sent = socket.send_fds(sock, [buf], fds)
        buf = buf[sent:]
    if buf:
        sock.sendall(buf)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise EOFError("connection closed")
        out += chunk
    return out


def recv_msg(sock: socket.socket) -> dict:
    """The next message, as `send_msg` sent it (without fds); EOFError once the peer is gone."""
    (n,) = _HEAD.unpack(_recv_exact(sock, _HEAD.size))
    return json.loads(_recv_exact(sock, n))


def end_as(status: dict) -> None:
    """Exit as the engine did: `{"signal": N}` raised again on this process, else `{"code": N}`."""
    sig = status.get("signal")
    if sig:
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
    os._exit(int(status.get("code", 1)) & 0xFF)


def connect(path: str, wait: float = CONNECT_WAIT) -> socket.socket:
    """The fork server's socket; it may still be importing (started just before mpiexec): retried."""
    deadline = time.monotonic() + wait
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError) as e:
            sock.close()
            if time.monotonic() > deadline:
                sys.stderr.write(f"jupyter-dist: the engine fork server at {path} cannot be reached ({e})\n")
                os._exit(1)
            time.sleep(0.02)


def main(argv: list[str]) -> None:
    path, args = argv[1], argv[2:]
    sock = connect(path)
    send_msg(sock, {"argv": args, "env": {**os.environ, STUB_PID_ENV: str(os.getpid())}, "cwd": os.getcwd()},
             [0, 1, 2])
    pid = int(recv_msg(sock)["pid"])

    def forward(sig: int, _frame: object) -> None:
        try:  # noqa: SIM105 - no contextlib import: the stub's start is counted in milliseconds
            os.kill(pid, sig)
        except OSError:
            pass

    for name in FORWARDED:
        signal.signal(getattr(signal, name), forward)
    while True:
        try:
            msg = recv_msg(sock)
        except InterruptedError:
            continue
        except (EOFError, OSError):
            os._exit(1)  # the fork server is gone (it killed the engine on its way out)
        if "code" in msg or "signal" in msg:
            end_as(msg)


if __name__ == "__main__":
    main(sys.argv)
