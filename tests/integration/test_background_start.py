"""`%load_ext jupyter_dist` with DistSettings.background_start: the engines start in the background with the
panel's layout, the first cell uses them, a cell of another layout restarts them (one line), the setting
turned off starts nothing. Real kernels (tests/kernel.py), real mpiexec engines; 2 ranks, then 3."""

from __future__ import annotations

import pytest
from kernel import execute, started_kernel

pytestmark = [pytest.mark.engines, pytest.mark.timeout(300)]

ENGINE_PIDS = ("import jupyter_dist\n"
               "_c = jupyter_dist.get_session().cluster\n"
               "print('PIDS', sorted(e.pid for e in _c.engines), 'BG', _c.background is not None, _c.from_background)")
CELL = "%%distrun -f pytorch -N 1 -n {n}\nimport os, torch.distributed as d\nprint('pid', os.getpid())"


def run(kc, code: str, timeout: float = 180) -> str:
    return execute(kc, code, timeout).raise_error().stdout


def test_load_ext_starts_the_panels_layout_and_the_first_cell_uses_it(tmp_path):
    env = {"JUPYTER_DIST_BACKGROUND_START": "1", "JUPYTER_DIST_DIR": str(tmp_path)}  # fresh defaults: 2 ranks
    with started_kernel(env) as (_km, kc):
        out = run(kc, "%load_ext jupyter_dist")
        assert "jupyter-dist: starting 2 engines in the background (mpi" in out
        assert "JUPYTER_DIST_BACKGROUND_START=0" in out  # the line says how to turn it off
        first = run(kc, CELL.format(n=2))
        assert "restarting" not in first, first
        pids = {int(line.rsplit(" ", 1)[1]) for line in first.splitlines() if " pid " in line}
        state = run(kc, ENGINE_PIDS)
        assert f"PIDS {sorted(pids)} BG False True" in state, (first, state)  # the background's engines ran it

        other = run(kc, CELL.format(n=3))  # another layout than the background's: restarted, said once
        lines = [line for line in other.splitlines() if "started in the background" in line]
        assert len(lines) == 1 and "restarting them" in lines[0] and "3 ranks" in lines[0], other
        assert other.count(" pid ") == 3
        assert "BG False False" in run(kc, ENGINE_PIDS)


def test_the_setting_off_starts_nothing(tmp_path):
    env = {"JUPYTER_DIST_BACKGROUND_START": "0", "JUPYTER_DIST_DIR": str(tmp_path)}
    with started_kernel(env) as (_km, kc):
        assert "background" not in run(kc, "%load_ext jupyter_dist")
        assert "PIDS [] BG False False" in run(kc, ENGINE_PIDS + "\nprint('running', _c.running)")
