"""The fork server's protocol with real processes (engine/zygote.py, engine/zygote_stub.py): a stub's
arguments, environment, working folder and fds reach the forked child; the stub ends as the child did
(exit code, or the same signal); signals to the stub reach the child; a stub's or the kernel's death
kills the child. The child is a small module here (`--run`), not an engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from jupyter_dist.engine import zygote_stub
from jupyter_dist.engine.faults import pmix_server_ports

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import os, signal, sys, time
what = sys.argv[1]
print("child", os.getpid(), os.environ.get("ZT_VAR"), os.getcwd(), sys.argv[1:], flush=True)
if what == "exit":
    sys.exit(int(sys.argv[2]))
if what == "signal":
    os.kill(os.getpid(), int(sys.argv[2]))
if what == "sleep":
    time.sleep(60)
if what == "ports":
    import json
    from jupyter_dist.engine.faults import launcher_ports
    print(json.dumps(sorted(launcher_ports())), flush=True)
"""


def gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("zygote")
    (folder / "zt_child.py").write_text(CHILD)
    sock = str(folder / "s")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)])}
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_dist.engine.zygote", sock, str(os.getpid()),
                             "--run", "zt_child", "json"], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield sock, folder, proc
    proc.terminate()
    proc.wait(10)


def stub(sock: str, *args: str, cwd: Path, **popen) -> subprocess.Popen:
    env = {**os.environ, "ZT_VAR": "from-the-stub"}
    return subprocess.Popen([sys.executable, "-I", "-S", zygote_stub.__file__, sock, *args], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, text=True, **popen)


def child_pid(p: subprocess.Popen) -> int:
    return int(p.stdout.readline().split()[1])


def test_the_child_gets_the_stubs_state_and_the_stub_its_exit_code(server, tmp_path):
    sock, _, proc = server
    p = stub(sock, "exit", "3", cwd=tmp_path)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 3
    _, pid, var, cwd, args = out.split(" ", 4)
    assert var == "from-the-stub" and cwd == str(tmp_path) and "'exit', '3'" in args
    assert int(pid) != p.pid and psutil.Process(proc.pid).is_running()


def test_a_signal_death_is_the_stubs_too(server, tmp_path):
    p = stub(server[0], "signal", str(int(signal.SIGSEGV)), cwd=tmp_path)
    p.communicate(timeout=30)
    assert p.returncode == -signal.SIGSEGV


def test_signals_to_the_stub_reach_the_child(server, tmp_path):
    p = stub(server[0], "sleep", cwd=tmp_path)
    pid = child_pid(p)
    assert psutil.Process(pid).ppid() == server[2].pid  # forked by the server
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)
    assert p.returncode == -signal.SIGTERM and gone(pid)


def test_a_killed_stub_takes_its_child(server, tmp_path):
    p = stub(server[0], "sleep", cwd=tmp_path)
    pid = child_pid(p)
    p.kill()
    p.wait(10)
    assert gone(pid)


def test_the_server_and_its_children_end_with_the_kernel(tmp_path):
    (tmp_path / "zt_child.py").write_text(CHILD)
    sock = str(tmp_path / "s")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    # a stand-in for the kernel: it starts the server, says its pid, and is then killed
    kernel = subprocess.Popen([sys.executable, "-c", (
        "import os, subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-m', 'jupyter_dist.engine.zygote', {sock!r}, str(os.getpid()), "
        "'--run', 'zt_child'], stdout=subprocess.DEVNULL)\n"
        "print(p.pid, flush=True)\ntime.sleep(60)\n")], env=env, stdout=subprocess.PIPE, text=True)
    server_pid = int(kernel.stdout.readline())
    p = stub(sock, "sleep", cwd=tmp_path)
    pid = child_pid(p)
    kernel.kill()
    kernel.wait(10)
    assert gone(server_pid) and gone(pid)
    p.wait(10)
    assert p.returncode != 0


def test_the_daemon_that_started_the_stub_is_the_forked_childs_launcher(server, tmp_path):
    """A release never shuts a rank's connection to mpiexec's daemon (engine/faults.py launcher_ports): the
    daemon is the stub's parent, not the forked engine's (whose parent is the server), and its listening
    port must be protected all the same. Here a stand-in daemon listens on a port and starts the stub."""
    env = {**os.environ, "PMIX_SERVER_URI41": "prterun-vm-1@0.0;tcp4://127.0.0.1:1"}
    daemon = subprocess.Popen([sys.executable, "-c", (
        "import socket, subprocess, sys\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "print(s.getsockname()[1], flush=True)\n"
        f"sys.exit(subprocess.run([sys.executable, '-I', '-S', {zygote_stub.__file__!r}, {server[0]!r}, 'ports'])"
        ".returncode)\n")], env=env, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    port = int(daemon.stdout.readline())
    child_pid(daemon)
    protected = json.loads(daemon.stdout.readline())
    assert daemon.wait(30) == 0
    assert port in protected
    assert 1 in protected  # the PMIx server's port named in the environment


def test_pmix_server_ports_from_the_environment():
    env = {"PMIX_SERVER_URI41": "prterun-vm-17123@0.0;tcp4://127.0.0.1:55285",
           "PMIX_SERVER_URI2": "prterun-vm-17123@0.0;tcp6://[::1]:55286", "PMIX_SERVER_TMPDIR": "/tmp/x:1",
           "PMIX_SERVER_URI21": "garbage"}
    assert pmix_server_ports(env) == {55285, 55286}
