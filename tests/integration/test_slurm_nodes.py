"""`%%distrun --launcher slurm` over a real Slurm cluster of three nodes (tests/slurm_cluster.py).

Each node is a `slurmd` in a network namespace of its own: the engines of node 1 cannot reach node
0 through loopback, so every address a rank gets must be the one the nodes share. One engine job
serves the module's runs while the layout stays the same (warm engines across nodes); the last test
takes all three nodes. Node 1 sees the kernel's profile folder as an empty disk of its own: what its
ranks write there (stack and crash files) reaches the notebook through their engines and agents only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from cells import ddp_cell
from slurm_cluster import WHERE, module_cluster

import jupyter_dist
from jupyter_dist.cluster.profile import state_dir

pytestmark = [pytest.mark.engines, pytest.mark.timeout(600)]

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(jupyter_dist.__file__))))
FLAGS = "--launcher slurm --time 10 -N 2 -n 2"


@pytest.fixture(scope="module")
def nodes(request):
    # node 1 keeps the cluster's profiles (connection files, stack and crash files) on a disk of its own
    return module_cluster(request, 3, private={1: [str(state_dir() / "profiles")]})


@pytest.fixture(scope="module")
def nshell(nodes, shell):
    """The module's shell, set up after (so stopped before) the Slurm nodes."""
    return shell


def test_ddp_across_two_nodes(nshell, distrun, nodes, capsys):
    t0 = time.monotonic()
    out = distrun(f"{FLAGS} -f pytorch -o got", WHERE + ddp_cell(result="params = torch.cat([p.detach().flatten() "
                                                                          "for p in model.parameters()])\n"
                                                                          "got = dict(where, params=params)"))
    first = time.monotonic() - t0
    got = nshell.user_ns["got"]
    master = nodes.addrs[0]
    for r, g in enumerate(got):
        node = r // 2
        assert g["host"] == nodes.names[node] and g["addrs"] == [nodes.addrs[node]], (r, g)
        assert g["code"].startswith(HERE), g["code"]  # this checkout's code, not another one's
        assert g["env"]["MASTER_ADDR"] == master and g["env"]["NODE_RANK"] == str(node), (r, g["env"])
        assert g["env"]["RANK"] == str(r) and g["env"]["LOCAL_RANK"] == str(r % 2) and g["env"]["WORLD_SIZE"] == "4"
        assert g["env"]["GLOO_SOCKET_IFNAME"] == "eth0"  # the interface that reaches node 0, found on the node
        assert f"[rank {r}|node {node}] trained rank={r} world=4" in out.out
    assert all(got[0]["params"].equal(g["params"]) for g in got)  # the replicas stayed equal
    cluster = jupyter_dist.get_session().cluster
    assert cluster.controller_ip == nodes.host_addr and cluster.node_addrs == tuple(nodes.addrs[:2])
    assert f"controller on {nodes.host_addr}" in out.out
    jobs = [j for j in nodes.jobs() if j[1].startswith("jupyter-dist-")]
    assert len(jobs) == 1 and jobs[0][2] == "RUNNING"
    # a warm cell across the nodes, beside the figure docs/slurm.md gives for one node
    t1 = time.monotonic()
    distrun(f"{FLAGS} -f pytorch -o again", "again = float(params.sum())")
    warm = time.monotonic() - t1
    with capsys.disabled():
        print(f"\njob submit to first result (DDP cell, 2 nodes x 2): {first:.1f} s; warm cell across 2 nodes: {warm:.2f} s")
    assert len(set(nshell.user_ns["again"])) == 1


def test_tf_config_names_the_nodes(nshell, nodes):
    """TF_CONFIG from the layout the cluster learned (the plan alone: TensorFlow's start-up is too
    slow for this machine's share, and the addresses are what differs across nodes)."""
    import json

    from jupyter_dist.plan import spec as specmod
    from jupyter_dist.plan.plan import plan

    session = jupyter_dist.get_session()
    c = session.cluster
    spec = specmod.resolve(specmod.parse_args(f"{FLAGS} -f tensorflow"), session.store.value)
    got = plan(spec, c.node_fabrics, ports=session._ports(spec), addrs=c.node_addrs, inherited=c.inherited_env)
    workers = json.loads(got.envs[0]["TF_CONFIG"])["cluster"]["worker"]
    assert [w.rsplit(":", 1)[0] for w in workers] == [nodes.addrs[0]] * 2 + [nodes.addrs[1]] * 2
    assert len(set(workers)) == 4


def test_mpi_allreduce_across_two_nodes(nshell, distrun, nodes):
    before = [j for j in nodes.jobs() if j[1].startswith("jupyter-dist-")]
    distrun(f"{FLAGS} -f mpi -o got", WHERE + textwrap.dedent(
        """
        from mpi4py import MPI
        got = dict(where, rank=MPI.COMM_WORLD.rank, total=MPI.COMM_WORLD.allreduce(MPI.COMM_WORLD.rank + 1))
        """))
    got = nshell.user_ns["got"]
    assert [g["rank"] for g in got] == [0, 1, 2, 3] and {g["total"] for g in got} == {10}
    for r, g in enumerate(got):
        assert g["host"] == nodes.names[r // 2]
        assert g["env"]["AZ_BATCHAI_MPI_MASTER_NODE"] == nodes.addrs[0]
        assert g["env"]["AZ_BATCH_MASTER_NODE"].startswith(nodes.addrs[0] + ":")
    assert [j for j in nodes.jobs() if j[1].startswith("jupyter-dist-")] == before  # the same job, warm


def test_a_rank_failing_on_node_1(nshell, distrun, nodes):
    from jupyter_dist.errors import RankFailure

    cluster = jupyter_dist.get_session().cluster
    port = cluster.master_port
    with pytest.raises(RankFailure) as err:
        distrun(f"{FLAGS} -f pytorch", "import os\nif os.environ['RANK'] == '3':\n    raise ValueError('bad shard on node 1')\n")
    assert "rank 3" in str(err.value) and "bad shard on node 1" in str(err.value)
    report = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(err.value.report))  # IPython's colours
    assert "Traceback" in report and "ValueError: bad shard on node 1" in report, report  # its traceback
    # the next run's master port is chosen free on node 0, where the store listens
    distrun(f"{FLAGS} -f pytorch -o after", "import torch.distributed as dist\ndist.init_process_group('gloo')\n"
                                            "after = (os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']))")
    after = nshell.user_ns["after"]
    assert {a[0] for a in after} == {nodes.addrs[0]} and len({a[1] for a in after}) == 1
    assert cluster.master_port and cluster.master_port == after[0][1], (port, cluster.master_port)


def test_torchrun_across_two_nodes(nshell, distrun, nodes):
    """One torchrun agent per node (node 1's in its own namespace), its workers meeting at node 0."""
    out = distrun(f"{FLAGS} -f torchrun", textwrap.dedent(
        """
        import os, socket, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        print(f"TR rank={dist.get_rank()} host={socket.gethostname()} master={os.environ['MASTER_ADDR']} sum={t.item():g}")
        dist.destroy_process_group()  # workers that exit with the group alive can abort in gloo's teardown
        """))
    for r in range(4):
        assert f"TR rank={r} host={nodes.names[r // 2]} master={nodes.addrs[0]} sum=10" in out.out, out.out


def test_timeout_stacks_from_both_nodes(nshell, distrun, nodes, capsys):
    from jupyter_dist.errors import RunTimeout
    from jupyter_dist.plan.defaults import STORE

    cell = "import os, time\ndef wait_here():\n    time.sleep(600)\nif os.environ['NODE_RANK'] == '1':\n    wait_here()\n"
    capsys.readouterr()
    with pytest.raises(RunTimeout) as err:
        nshell.run_cell_magic("distrun", f"{FLAGS} -f pytorch --timeout 5", cell)
    STORE.update(timeout=None)  # --timeout is remembered like every flag
    capsys.readouterr()
    shown = "\n".join(err.value.report)
    # the stacks of the hung ranks, both on node 1, reached the notebook through their agents (node 1's address)
    assert "ranks 2,3: time.sleep at <cell>:3" in shown, shown
    assert "in wait_here" in shown, shown


def test_a_rank_crashing_on_node_1_without_a_shared_folder(nshell, distrun, nodes):
    """A fatal signal on node 1: its crash file is on node 1's own disk, read there by a live rank's agent."""
    from jupyter_dist.errors import RankFailure

    cluster = jupyter_dist.get_session().cluster
    distrun(f"{FLAGS} -f pytorch", "x = 1")
    stacks = Path(cluster.stack_dir)
    assert (stacks / "crash-rank-0.txt").exists() and not (stacks / "crash-rank-3.txt").exists()  # node 1's: not here
    cell = ("import os, faulthandler\nprint('before the crash', os.environ['RANK'], flush=True)\n"
            "def crash_here():\n    faulthandler._sigsegv()\nif os.environ['RANK'] == '3':\n    crash_here()\n")
    with pytest.raises(RankFailure) as err:
        distrun(f"{FLAGS} -f pytorch", cell)
    shown = re.sub(r"\x1b\[[0-9;]*m", "", str(err.value) + "\n" + "\n".join(err.value.report))
    assert "rank 3" in shown and "crashed: Segmentation fault" in shown, shown
    assert "in crash_here" in shown and "line 4" in shown, shown  # its stack, from the crash file on node 1
    # node 1's lines reach the kernel's per-rank logs of the run over the engines' channel (rank 2's: rank 3's
    # last line, printed an instant before its segfault, can still be in flight when it dies on a loaded machine)
    run_dir = sorted((state_dir() / "logs").iterdir(), key=lambda p: p.stat().st_mtime)[-1]
    assert "before the crash 2" in (run_dir / "rank-2.log").read_text()


def test_exported_sbatch_job_runs_on_the_nodes(nshell, distrun, nodes, tmp_path):
    cell = ("import os, torch, torch.distributed as dist\ndist.init_process_group('gloo', init_method='env://')\n"
            "t = torch.tensor([float(dist.get_rank() + 1)])\ndist.all_reduce(t)\n"
            "print(f'EXPORTED rank={dist.get_rank()} sum={t.item():g} master={os.environ[\"MASTER_ADDR\"]}')\n")
    out = distrun(f"{FLAGS} -f pytorch", cell)
    assert out.out.count("sum=10 master=" + nodes.addrs[0]) == 4
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        nshell.run_line_magic("dist", "export --format sbatch job.py")
    finally:
        os.chdir(cwd)
    batch = next(p for p in tmp_path.iterdir() if p.suffix in (".sh", ".sbatch"))
    text = batch.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=2" in text
    nshell.run_line_magic("dist", "stop")  # the engines' job holds every core of both nodes
    env = {**os.environ, "PYTHON": shutil.which("python", path=os.path.dirname(os.sys.executable)) or os.sys.executable}
    # on nodes 0 and 1, as the cell ran (the cluster has three: another pair would have another master)
    done = subprocess.run(["sbatch", "--parsable", "--wait", f"--nodelist={','.join(nodes.names[:2])}", batch.name], cwd=tmp_path, capture_output=True, text=True,
                          timeout=150, env=env)
    logs = "\n".join(p.read_text(errors="replace") for p in tmp_path.glob("*.out"))
    if done.returncode != 0:
        pytest.fail(f"the exported job failed ({done.returncode}): {done.stderr}\n{logs}\n--- the job file\n{text}")
    for r in range(4):
        assert f"EXPORTED rank={r} sum=10 master={nodes.addrs[0]}" in logs, logs


def test_ddp_all_reduce_on_three_nodes(nshell, distrun, nodes):
    """-N 3 -n 1: one rank per node, each in its own namespace, meeting at node 0's address."""
    out = distrun("--launcher slurm --time 10 -N 3 -n 1 -f pytorch -o got", WHERE + textwrap.dedent(
        """
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        got = dict(where, rank=dist.get_rank(), total=t.item())
        """))
    got = nshell.user_ns["got"]
    assert [g["rank"] for g in got] == [0, 1, 2] and {g["total"] for g in got} == {6.0}, out.out
    for r, g in enumerate(got):
        assert g["host"] == nodes.names[r] and g["addrs"] == [nodes.addrs[r]], (r, g)
        assert g["env"]["MASTER_ADDR"] == nodes.addrs[0] and g["env"]["NODE_RANK"] == str(r), (r, g["env"])
    assert jupyter_dist.get_session().cluster.node_addrs == tuple(nodes.addrs)
