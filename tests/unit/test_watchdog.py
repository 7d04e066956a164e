"""The watchdog's pid file: local pids and the engines' Slurm job."""

from __future__ import annotations

from jupyter_dist.cluster.watchdog import read_pids, read_slurm_jobs


def test_pidfile_tokens(tmp_path):
    f = tmp_path / "pids"
    f.write_text("12 34 slurm:567 slurm:x junk")
    assert read_pids(str(f)) == [12, 34]
    assert read_slurm_jobs(str(f)) == ["567"]
    assert read_pids(str(tmp_path / "missing")) == [] and read_slurm_jobs(str(tmp_path / "missing")) == []
