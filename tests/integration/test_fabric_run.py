"""Issue 7 on CPU, real engines: backend choice, --nccl-debug on every rank, doctor and the bench."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

pytestmark = [pytest.mark.engines, pytest.mark.timeout(300)]


def test_nccl_without_gpus_fails_before_starting(shell):
    import jupyter_dist

    with pytest.raises(UsageError, match=r"--backend nccl needs at least 2 CUDA GPUs per node"):
        shell.run_cell_magic("distrun", "-N 2 -n 2 --backend nccl", "pass")
    assert not jupyter_dist.get_session().cluster.running  # nothing started


def test_auto_falls_back_to_gloo_and_says_so(distrun, shell):
    out = distrun("-N 2 -n 2 --backend auto -o b", "import os\nb = os.environ['JUPYTER_DIST_BACKEND']")
    assert shell.user_ns["b"] == ["gloo"] * 4
    assert "no CUDA GPUs found: using gloo" in out.out


def test_nccl_debug_reaches_every_rank(distrun, shell):
    distrun("-N 2 -n 2 --nccl-debug -o d", "import os\nd = os.environ.get('NCCL_DEBUG'), os.environ.get('NCCL_DEBUG_SUBSYS')")
    assert shell.user_ns["d"] == [("INFO", "INIT,NET")] * 4
    distrun("-N 2 -n 2 -o d", "import os\nd = os.environ.get('NCCL_DEBUG')")
    assert shell.user_ns["d"] == [None] * 4  # not leaked into the next run


def test_gloo_socket_interface_is_loopback_for_virtual_nodes(distrun, shell):
    distrun("-N 2 -n 2 -o i", "import os\ni = os.environ.get('GLOO_SOCKET_IFNAME')")
    assert shell.user_ns["i"] == ["lo"] * 4


def test_doctor_on_this_machine(shell, capsys):
    shell.run_line_magic("dist", "doctor -N 2 -n 2")
    out = capsys.readouterr().out
    assert "transport" in out and "gloo over TCP (lo)" in out
    assert "Open MPI" in out


def test_bench_allreduce_on_four_ranks(shell, capsys):
    shell.run_line_magic("dist", "bench allreduce -N 2 -n 2")
    out = capsys.readouterr().out
    assert "# all_reduce, 4 ranks, backend gloo" in out
    assert "67108864" in out and "busbw" in out
    assert "local copy on one rank" in out
