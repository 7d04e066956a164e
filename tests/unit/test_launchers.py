"""The launchers, without engines: chosen by name (built-in or entry point), their checks, environment,
rank mapping, death notes and what the watchdog stops."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from IPython.core.error import UsageError

from jupyter_dist.cluster import launchers, watchdog
from jupyter_dist.cluster.engines import check_shape
from jupyter_dist.cluster.launchers.local import LocalLauncher
from jupyter_dist.cluster.launchers.mpi import MpiLauncher, open_mpi_env, parse_death_notes
from jupyter_dist.cluster.launchers.slurm import SlurmLauncher
from jupyter_dist.cluster.launchers.ssh import SshLauncher
from jupyter_dist.cluster.shape import ClusterShape
from jupyter_dist.plan.defaults import RunDefaults, launcher_names
from jupyter_dist.plan.spec import parse_args, resolve

PRTERUN_EXIT = """\
--------------------------------------------------------------------------
prterun detected that one or more processes exited with non-zero status,
thus causing the job to be terminated. The first process to do so was:

   Process name: [prterun-host-1234@1,2]
   Exit code:    3
--------------------------------------------------------------------------
"""
PRTERUN_SIGNAL = "prterun noticed that process rank 1 with PID 4242 on node host exited on\nsignal 9 (Killed).\n"


def test_launchers_by_name():
    assert launchers.launcher_class("mpi") is MpiLauncher
    assert launchers.launcher_class("local") is LocalLauncher
    assert launchers.launcher_class("ssh") is SshLauncher
    assert launchers.launcher_class("slurm") is SlurmLauncher
    assert isinstance(launchers.launcher_for(ClusterShape("ssh", 2, ("a", "b"))), SshLauncher)
    with pytest.raises(UsageError, match=r"^--launcher pbs is not supported yet\.$"):
        launchers.launcher_class("pbs")
    with pytest.raises(UsageError, match="--launcher pbs is not supported yet"):
        check_shape(ClusterShape("pbs", 2, ()))


def test_a_launcher_from_an_entry_point(tmp_path, monkeypatch):
    (tmp_path / "jd_pbs_launcher.py").write_text(
        "from jupyter_dist.cluster.launchers.local import LocalLauncher\n\n"
        "class PbsLauncher(LocalLauncher):\n    name = 'pbs'\n")
    dist = tmp_path / "jd_pbs_launcher-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: jd-pbs-launcher\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[jupyter_dist.launchers]\npbs = jd_pbs_launcher:PbsLauncher\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    launchers.registry.cache_clear()
    launcher_names.cache_clear()
    try:
        assert launchers.launcher_class("pbs").__name__ == "PbsLauncher"
        assert list(launchers.registry())[:4] == ["local", "mpi", "ssh", "slurm"]
        check_shape(ClusterShape("pbs", 2, ()))
        assert launcher_names() == ("mpi", "local", "ssh", "slurm", "pbs")
        assert resolve(parse_args("--launcher pbs -n 2"), RunDefaults(), mpiexec_found=False).launcher == "pbs"
    finally:
        launchers.registry.cache_clear()
        launcher_names.cache_clear()


def test_an_unknown_launcher_is_refused_by_the_flag_naming_the_choices():
    with pytest.raises(UsageError, match=r"--launcher must be one of mpi, local, ssh, slurm, not 'pbs'"):
        resolve(parse_args("--launcher pbs"), RunDefaults(), mpiexec_found=False)


def test_open_mpi_env_on_one_host(monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert open_mpi_env(4, 8) == ({"OMPI_MCA_btl": "self,sm"}, [])
    env, notes = open_mpi_env(4, 2, all_local=False)
    assert env == {"PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe"}
    assert notes == ["4 ranks on 2 cores: set PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe"]
    monkeypatch.setattr("os.geteuid", lambda: 0)
    env, notes = open_mpi_env(1, 1)
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    assert notes[0].startswith("running as root")


def test_mpi_env_of_a_remote_shape_never_oversubscribes():
    env, _ = MpiLauncher(ClusterShape("mpi", 64, ("10.0.0.2", "10.0.0.3"))).mpi_env()
    assert "PRTE_MCA_rmaps_default_mapping_policy" not in env and "OMPI_MCA_btl" not in env
    assert env["PYTHONUNBUFFERED"] == "1"
    local, _ = MpiLauncher(ClusterShape("mpi", 2, ())).mpi_env()
    assert local["OMPI_MCA_btl"] == "self,sm"


def test_death_notes_from_prterun():
    assert parse_death_notes(PRTERUN_EXIT) == {2: "exited with code 3"}
    assert parse_death_notes(PRTERUN_SIGNAL) == {1: "was killed by signal 9 (Killed)"}
    shape = ClusterShape("mpi", 4, ())
    assert MpiLauncher(shape).death_notes(PRTERUN_EXIT + PRTERUN_SIGNAL) == {2: "exited with code 3",
                                                                            1: "was killed by signal 9 (Killed)"}
    assert LocalLauncher(ClusterShape("local", 4, ())).death_notes(PRTERUN_EXIT) == {}


def test_ranks_by_mpi_rank_or_by_registration():
    infos = [{"mpi_rank": 1, "mpi_size": 2}, {"mpi_rank": 0, "mpi_size": 2}]
    assert MpiLauncher(ClusterShape("mpi", 2, ())).ranks(None, [5, 6], infos, "127.0.0.1") == {5: 1, 6: 0}
    with pytest.raises(RuntimeError, match="engine 5 reports no MPI world of 2"):
        MpiLauncher(ClusterShape("mpi", 2, ())).ranks(None, [5, 6], [{"mpi_rank": None, "mpi_size": None}] * 2, "")
    with pytest.raises(RuntimeError, match="engine 6 reports no MPI world of 2"):
        SlurmLauncher(ClusterShape("slurm", 2, ())).ranks(None, [5, 6], [infos[0], {"mpi_rank": 0, "mpi_size": 3}], "")
    assert LocalLauncher(ClusterShape("local", 3, ())).ranks(None, [0, 2, 7], [{}] * 3, "") == {0: 0, 2: 1, 7: 2}


def test_remote_only_with_other_hosts():
    assert not MpiLauncher(ClusterShape("mpi", 2, ())).remote
    assert MpiLauncher(ClusterShape("mpi", 2, ("localhost", "10.0.0.3"))).remote
    assert SshLauncher(ClusterShape("ssh", 2, ("10.0.0.2", "10.0.0.3"))).remote
    assert not SlurmLauncher(ClusterShape("slurm", 2, ("10.0.0.2", "10.0.0.3"), slurm_nodes=2)).remote


def test_the_watchdog_stops_the_slurm_job_too(tmp_path):
    slurm = SlurmLauncher(ClusterShape("slurm", 4, (), slurm_nodes=2))
    assert slurm.job().procs_per_node == 2
    assert slurm.watchdog_tokens(SimpleNamespace(job_id="1234")) == ["slurm:1234"]
    assert slurm.watchdog_tokens(SimpleNamespace(job_id=None)) == []
    assert MpiLauncher(ClusterShape("mpi", 2, ())).watchdog_tokens(SimpleNamespace(job_id="1")) == []
    pidfile = Path(tmp_path / "pids")
    watchdog.write_pidfile(pidfile, [30, 12, 30], slurm.watchdog_tokens(SimpleNamespace(job_id="1234")))
    assert pidfile.read_text() == "12 30 slurm:1234"
    assert watchdog.read_pids(str(pidfile)) == [12, 30] and watchdog.read_slurm_jobs(str(pidfile)) == ["1234"]


def test_no_launcher_process_is_not_running():
    launcher = LocalLauncher(ClusterShape("local", 1, ()))
    assert not launcher.running(None)
    assert not launcher.running(SimpleNamespace(pid=-1))  # an ssh engine set
    assert launcher.running(SimpleNamespace(pid=os.getpid()))
