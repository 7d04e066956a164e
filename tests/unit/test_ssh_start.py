"""`--launcher ssh`'s start script (cluster/launchers/ssh_start.py), run by a real local `sh`."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from jupyter_dist.cluster.launchers.ssh_start import host_script, parse_pids, wait_script

pytestmark = pytest.mark.timeout(60)


def test_host_script_starts_every_engine_in_the_background_with_its_env(tmp_path):
    code = "import os, sys; print(os.environ['JD_X'], sys.argv[1]); import time; time.sleep(30)"
    engines = [([sys.executable, "-c", code, f"e{i}"], {"JD_X": f"it's {i}"}, str(tmp_path / "log" / f"e{i}.out"))
               for i in range(3)]
    t0 = time.monotonic()
    out = subprocess.run(["sh", "-s"], input=host_script(engines), capture_output=True, text=True, check=True).stdout
    took = time.monotonic() - t0
    pids = parse_pids(out, 3)
    try:
        assert len(set(pids)) == 3 and all(psutil.pid_exists(p) for p in pids)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all((tmp_path / "log" / f"e{i}.out").read_text() for i in range(3)):
            time.sleep(0.1)
        for i in range(3):
            assert (tmp_path / "log" / f"e{i}.out").read_text() == f"it's {i} e{i}\n"
        print(f"the script returned after {took:.2f} s, before its engines ended")
        assert subprocess.run(["sh", "-c", wait_script(pids[0], 1)], capture_output=True, text=True,
                              check=True).stdout.strip() == "__process_running=1__"
    finally:
        for p in pids:
            psutil.Process(p).kill()
    psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=5)
    assert "__process_running=0__" in subprocess.run(["sh", "-c", wait_script(pids[0], None)], capture_output=True,
                                                     text=True, check=True).stdout


def test_a_missing_pid_is_one_clear_error():
    with pytest.raises(RuntimeError, match=r"no pid for engine\(s\) \[1\]"):
        parse_pids("__jd_pid_0=12__\n", 2)
