"""Start-up pieces that need no engine: the preload's engine argument and thread, the setting, the GPU probe."""

from __future__ import annotations

import os
import sys
import types

import pytest

from jupyter_dist.cluster import preload
from jupyter_dist.engine import node_probe
from jupyter_dist.engine import preload as engine_preload
from jupyter_dist.plan.settings import DistSettings


def test_torch_frameworks_preload_what_their_setup_imports():
    assert preload.modules_for("torch") == ("torch.distributed",)
    assert preload.modules_for("mpi") == ()
    assert preload.modules_for("torchrun") == ()  # its workers are new processes: the engines need no torch


def test_the_startup_command_reaches_mpi_and_local_engines_only():
    ipp = pytest.importorskip("ipyparallel")
    cluster = ipp.Cluster(engines="mpi", n=2)
    assert preload.configure(cluster, "mpi", False, ("torch.distributed",))
    args = cluster.config.MPIEngineSetLauncher.engine_args
    assert args == [f"--IPEngine.startup_command={preload.startup_command(('torch.distributed',))}"]
    assert "del _jd_preload" in args[0]  # no name left in the rank's namespace
    assert not preload.configure(cluster, "ssh", False, ("torch.distributed",))
    assert not preload.configure(cluster, "mpi", True, ("torch.distributed",))  # other hosts: args go through a shell
    assert not preload.configure(cluster, "local", False, ())


def test_the_engine_imports_in_a_thread(tmp_path, monkeypatch):
    (tmp_path / "jd_preload_probe.py").write_text("import threading\nTHREAD = threading.current_thread().name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    engine_preload.start(["jd_preload_probe", "jd_no_such_module"])  # a module that fails is left to the cell
    assert engine_preload.wait(30)
    assert sys.modules["jd_preload_probe"].THREAD == "jupyter-dist-preload"
    assert "jd_no_such_module" not in sys.modules


@pytest.mark.parametrize(("value", "on"), [(None, False), ("0", False), ("1", True), ("true", True), ("off", False)])
def test_background_start_setting_reads_its_variable(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv("JUPYTER_DIST_BACKGROUND_START", raising=False)
    else:
        monkeypatch.setenv("JUPYTER_DIST_BACKGROUND_START", value)
    assert DistSettings().background_start is on


@pytest.mark.skipif(os.path.exists("/dev/kfd"), reason="a ROCm device: torch is asked")
def test_no_gpu_driver_means_no_torch_import(monkeypatch):
    monkeypatch.setattr(node_probe, "_nvml_names", lambda: None)
    monkeypatch.setattr(node_probe, "_nvidia_smi_names", lambda: None)
    fake = types.ModuleType("torch")  # would say 5 GPUs if it were asked
    fake.cuda = types.SimpleNamespace(device_count=lambda: 5)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert node_probe.detect_gpus() == (0, ())


def test_work_between_cells_waits_for_the_loop_where_one_runs():
    import asyncio

    from jupyter_dist.cluster.idle import when_idle

    done: list[str] = []
    assert not when_idle(lambda: done.append("now"))  # no loop (a terminal shell, a test's shell): at once
    assert done == ["now"]

    async def cell() -> None:
        assert when_idle(lambda: done.append("after"))
        assert done == ["now"]  # not inside the cell
        await asyncio.sleep(0.2)

    asyncio.run(cell())
    assert done == ["now", "after"]


def test_a_background_start_that_fails_is_told_to_the_first_cell_which_starts_anew():
    from jupyter_dist.cluster import background
    from jupyter_dist.cluster.engines import EngineCluster
    from jupyter_dist.cluster.shape import ClusterShape

    c = EngineCluster()
    background.start(c, ClusterShape("ssh", 2, ()))  # refused before any process starts: no --hosts
    said: list[str] = []
    bg = background.wait(c, said.append)
    assert bg is not None and bg.error is not None and c.background is None and not c.running
    assert said[-1].startswith("the engines started in the background did not start (--launcher ssh starts")
    assert said[-1].endswith(": starting them now")
    assert background.wait(c, said.append) is None  # forgotten once joined
