"""`--launcher ssh`'s engine start: one ssh per host starting that host's engines, all hosts at once.

ipyparallel's own SSH engine set starts its engines one after another, and each start costs four
ssh round trips, two of them a Python import on the far side (a shell probe, `python --version`,
`ipython profile create`, then the start itself). Here a host gets one `sh -s` script that makes
the log folder and starts its engines under `nohup`, each printing its pid; the hosts' scripts run
concurrently. Watching and signalling an engine use a plain shell loop and `kill` over ssh rather
than a remote Python.
"""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

START_TIMEOUT_S = 120.0
_PID = re.compile(r"__jd_pid_(\d+)=(\d+)__")


def host_script(engines: list[tuple[list[str], dict[str, str], str]]) -> str:
    """A POSIX shell script that starts each (argv, env, output file) in the background and prints
    `__jd_pid_<i>=<pid>__` for the i-th (pure, for the unit tests)."""
    lines = ["set -e"]
    for i, (argv, env, out) in enumerate(engines):
        folder = out.rsplit("/", 1)[0] if "/" in out else "."
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
        cmd = " ".join(shlex.quote(a) for a in argv)
        lines.append(f"mkdir -p {shlex.quote(folder)}")
        lines.append(f"env {assigns} nohup {cmd} > {shlex.quote(out)} 2>&1 < /dev/null &")
        lines.append(f"echo __jd_pid_{i}=$!__")
    return "\n".join(lines) + "\n"


def parse_pids(out: str, count: int) -> list[int]:
    """The pids `host_script` printed, in order; one clear error when one is missing."""
    found = {int(i): int(pid) for i, pid in _PID.findall(out)}
    missing = [i for i in range(count) if i not in found]
    if missing:
        raise RuntimeError(f"the engine start script printed no pid for engine(s) {missing}: {out.strip()!r}")
    return [found[i] for i in range(count)]


def wait_script(pid: int, timeout: float | None) -> str:
    """Waits up to `timeout` s (None: for ever) for `pid` to end; prints ipyparallel's `__key=value__` lines."""
    limit = "" if timeout is None else str(max(1, int(timeout)))
    return (f"t=0; while kill -0 {pid} 2>/dev/null; do "
            f"if [ -n '{limit}' ] && [ $t -ge '{limit or 0}' ]; then echo __process_running=1__; exit 0; fi; "
            "sleep 1; t=$((t+1)); done; echo __process_running=0__; echo __exit_code=-1__")


def run_ssh(ssh: list[str], host: str, script: str, timeout: float | None = START_TIMEOUT_S) -> str:
    """Run `script` with `sh -s` on `host`; its output, or one error naming the host and what ssh said."""
    done = subprocess.run([*ssh, host, "sh -s"], input=script, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        raise RuntimeError(f"starting engines on {host} through {' '.join(ssh)} failed: {said}")
    return done.stdout


@functools.cache
def parallel_ssh_engine_launcher() -> type:
    """ipyparallel's SSH engine set, subclassed on first use (ipyparallel is heavy to import)."""
    from ipyparallel.cluster.launcher import SSHEngineLauncher, SSHEngineSetLauncher  # heavy: first ssh run

    class JupyterDistSshEngine(SSHEngineLauncher):
        """One engine on a host, started by its host's script; watched and signalled with plain shell."""

        def started(self, pid: int) -> None:
            self.pid = pid
            self.notify_start({"host": self.location, "pid": pid})
            self._start_waiting()

        def wait_one(self, timeout: float | None) -> int:
            out = run_ssh(self.ssh_cmd + self.ssh_args, self.location, wait_script(self.pid, timeout), timeout=None)
            if "__process_running=1__" in out:
                raise TimeoutError("still running")
            return -1

        def get_output(self, remove: bool = False) -> str:
            """The engine's output file, read with `cat` over ssh (scp needs an sftp server a host may lack)."""
            if self._output is None:
                script = f"cat {shlex.quote(self.remote_output_file)} 2>/dev/null || true\n"
                try:
                    self._output = run_ssh(self.ssh_cmd + self.ssh_args, self.location, script, timeout=60)
                except (RuntimeError, subprocess.TimeoutExpired):
                    self._output = ""
            return self._output

        def signal(self, sig: int) -> None:
            if self.state == "running":
                run_ssh(self.ssh_cmd + self.ssh_args, self.location, f"kill -{int(sig)} {self.pid} 2>/dev/null || true\n",
                        timeout=60)

    class JupyterDistSshEngineSet(SSHEngineSetLauncher):
        """`engines` ({host: count}) started with one ssh per host, every host at once."""

        launcher_class = JupyterDistSshEngine

        def start(self, n: int) -> list[str]:
            engine_traits = self.launcher_class.class_traits(config=True)
            shared = set(self.traits(config=True)).intersection(engine_traits)
            inherited = shared.difference({"location", "user", "hostname", "to_send", "to_fetch"})
            inherited |= {"profile_dir", "cluster_id"}
            by_host: dict[str, list[Any]] = {}
            keys: list[str] = []
            for host, count in self.engines.items():
                for i in range(min(int(count), n - len(keys))):
                    kwargs = {attr: getattr(self, attr) for attr in inherited}
                    key = f"{host}/{i}"
                    el = self.launchers[key] = self.launcher_class(parent=self, identifier=key, **kwargs)
                    el.to_send = []
                    el.hostname = host  # `location` follows
                    el.on_stop(self._notice_engine_stopped)
                    by_host.setdefault(host, []).append(el)
                    keys.append(key)
            ssh = list(self.ssh_cmd) + list(self.ssh_args)

            def start_host(host: str) -> list[int]:
                els = by_host[host]
                script = host_script([(el.program + el.program_args, el.get_env(), el.remote_output_file) for el in els])
                return parse_pids(run_ssh(ssh, host, script), len(els))

            with ThreadPoolExecutor(max(1, len(by_host))) as pool:
                pids = dict(zip(by_host, pool.map(start_host, by_host), strict=True))
            for host, els in by_host.items():
                for el, pid in zip(els, pids[host], strict=True):
                    el.started(pid)
            self.notify_start(keys)
            self.n = len(keys)
            return keys

    return JupyterDistSshEngineSet
