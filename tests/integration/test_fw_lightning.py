"""-f lightning on real engines (2 nodes x 2 processes): the Trainer's own view of the ranks, DDP training."""

from __future__ import annotations

import textwrap

import pytest
from lightning_cells import LIGHTNING_FIT

from jupyter_dist.errors import RankFailure

pytest.importorskip("lightning")
pytestmark = [pytest.mark.engines, pytest.mark.timeout(300)]

MODEL = LIGHTNING_FIT


def check(results, environment):
    """Each rank's (trainer's view, parameters), brought back by `-o result`."""
    params = [p for _, p in results]
    for r, (view, _) in enumerate(results):
        assert view == (r, r // 2, r % 2, 4, 3, environment), view
    assert all(bool((p == params[0]).all()) for p in params)  # DDP kept the replicas identical


AZURE_MPI = textwrap.dedent(
    """
    import os
    # as Azure ML's documentation has Lightning code for an MPI job derive its environment
    if "AZ_BATCH_MASTER_NODE" in os.environ:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = os.environ["AZ_BATCH_MASTER_NODE"].split(":")
    else:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = os.environ["AZ_BATCHAI_MPI_MASTER_NODE"], "54965"
    os.environ["NODE_RANK"] = str(int(os.environ["OMPI_COMM_WORLD_RANK"]) // 2)
    os.environ["LOCAL_RANK"] = os.environ["OMPI_COMM_WORLD_LOCAL_RANK"]
    os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
    result = fit(devices=2, num_nodes=2)
    """
)


def test_azureml_mpi_lightning_code(distrun, shell):
    """Under -f mpi Lightning picks its MPI environment; its node comes from the run, so virtual nodes work.

    First in the module: only -f mpi's own engine hook has patched Lightning here.
    """
    distrun("-f mpi -N 2 -n 2 -o result --timeout 120", MODEL + AZURE_MPI)
    check(shell.user_ns["result"], "MPIEnvironment")


def test_trainer_sees_the_run(distrun, shell):
    distrun("-f lightning -N 2 -n 2 --timeout 240", MODEL)
    distrun("-f lightning -N 2 -n 2 -o result --timeout 120", "result = fit(devices=2, num_nodes=2)")
    # the run's environment, not MPIEnvironment (the engines run under MPI)
    check(shell.user_ns["result"], "RunEnvironment")


def test_rerun_and_slurm_variables_ignored(distrun, shell):
    """SLURM_NTASKS would make Lightning pick its Slurm environment; a second fit reuses the group."""
    flags = "-f lightning -N 2 -n 2 --env SLURM_NTASKS=4 --env SLURM_JOB_NAME=job --timeout 120"
    distrun(f"{flags} -o result", "result = fit(devices=2, num_nodes=2)")
    check(shell.user_ns["result"], "RunEnvironment")
    distrun(f"{flags} -o ws", "import os\nws = os.environ.get('WORLD_SIZE')")
    assert shell.user_ns["ws"] == ["4"] * 4  # Lightning's teardown did not take the run's WORLD_SIZE away


def test_layout_mismatch_is_one_sentence(shell, capsys):
    with pytest.raises(RankFailure) as info:
        shell.run_cell_magic("distrun", "-f lightning -N 2 -n 2 --timeout 120", "fit(devices=1, num_nodes=2)")
    capsys.readouterr()
    assert ("LayoutMismatch: Trainer(devices=1, num_nodes=2) does not match this run's layout (-N 2 -n 2): "
            "pass Trainer(devices=2, num_nodes=2) or change the %%distrun flags.") in str(info.value)
