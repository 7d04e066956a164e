"""%%distrun on real engines under real Open MPI: one 2 nodes x 2 processes cluster for the module."""

from __future__ import annotations

import os
import textwrap
import threading
import time

import pytest
from cells import ddp_cell

import jupyter_dist
from jupyter_dist.errors import RankFailure
from jupyter_dist.run.stacks import group

pytestmark = [pytest.mark.engines, pytest.mark.timeout(240)]

ENV_KEYS = ["RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"]

DDP_CELL = ddp_cell()


def test_environment_on_every_rank(distrun, shell):
    distrun("-f pytorch -N 2 -n 2 -o env", f"import os\nenv = {{k: os.environ.get(k) for k in {ENV_KEYS!r}}}")
    envs = shell.user_ns["env"]
    assert len(envs) == 4
    ports = {e["MASTER_PORT"] for e in envs}
    assert len(ports) == 1 and 0 < int(ports.pop()) < 65536
    for r, e in enumerate(envs):
        assert e["RANK"] == str(r) and e["WORLD_SIZE"] == "4"
        assert e["LOCAL_RANK"] == str(r % 2) and e["NODE_RANK"] == e["GROUP_RANK"] == str(r // 2)
        assert e["LOCAL_WORLD_SIZE"] == "2" and e["MASTER_ADDR"] == "127.0.0.1"


def test_mpi_rank_matches_and_allreduce(distrun, shell):
    out = distrun(
        "-f mpi -N 2 -n 2 -o got",
        "from mpi4py import MPI\nimport os\n"
        "got = (MPI.COMM_WORLD.rank, int(os.environ['OMPI_COMM_WORLD_RANK']), MPI.COMM_WORLD.allreduce(MPI.COMM_WORLD.rank))\n"
        "print('allreduce', got[2])",
    )
    got = shell.user_ns["got"]
    assert [g[0] for g in got] == [0, 1, 2, 3]
    assert [g[1] for g in got] == [0, 1, 2, 3]
    assert all(g[2] == 6 for g in got)
    for r in range(4):
        assert f"[rank {r}|node {r // 2}] allreduce 6" in out.out


def test_azureml_mpi_code_runs_unchanged(distrun, shell):
    cell = textwrap.dedent(
        """
        import os
        gpus_per_node = 2
        if "AZ_BATCH_MASTER_NODE" in os.environ:
            addr, port = os.environ["AZ_BATCH_MASTER_NODE"].split(":")
        else:
            addr, port = os.environ["AZ_BATCHAI_MPI_MASTER_NODE"], "54965"
        derived = dict(
            NODE_RANK=int(os.environ["OMPI_COMM_WORLD_RANK"]) // gpus_per_node,
            LOCAL_RANK=int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"]),
            WORLD_SIZE=int(os.environ["OMPI_COMM_WORLD_SIZE"]),
            MASTER_ADDR=addr, MASTER_PORT=int(port),
        )
        """
    )
    distrun("-f mpi -N 2 -n 2 -o derived", cell)
    d = shell.user_ns["derived"]
    assert [x["NODE_RANK"] for x in d] == [0, 0, 1, 1]
    assert [x["LOCAL_RANK"] for x in d] == [0, 1, 0, 1]
    assert {x["WORLD_SIZE"] for x in d} == {4}
    assert {x["MASTER_ADDR"] for x in d} == {"127.0.0.1"}


def test_framework_switch_does_not_leak(distrun, shell):
    distrun("-f mpi -N 2 -n 2 -o seen", "import os\nseen = os.environ.get('RANK'), os.environ.get('OMPI_COMM_WORLD_LOCAL_RANK')")
    assert [s[0] for s in shell.user_ns["seen"]] == [None] * 4
    assert [s[1] for s in shell.user_ns["seen"]] == ["0", "1", "0", "1"]
    distrun("-f pytorch -N 2 -n 2 -o seen", "import os\nseen = os.environ.get('RANK'), os.environ.get('AZ_BATCHAI_MPI_MASTER_NODE')")
    assert [s[0] for s in shell.user_ns["seen"]] == ["0", "1", "2", "3"]
    assert [s[1] for s in shell.user_ns["seen"]] == [None] * 4


def test_ddp_replicas_identical_and_rerun(distrun, shell):
    first = distrun("-f pytorch -N 2 -n 2 -o params", DDP_CELL)
    p1 = shell.user_ns["params"]
    assert all(bool((p == p1[0]).all()) for p in p1)
    for r in range(4):
        assert f"trained rank={r} world=4" in first.out
    second = distrun("-f pytorch -N 2 -n 2 -o params", DDP_CELL)  # init_process_group again
    p2 = shell.user_ns["params"]
    assert all(bool((p == p2[0]).all()) for p in p2)
    assert "trained rank=3 world=4" in second.out


def test_warm_engines_keep_variables(distrun, shell):
    distrun("-N 2 -n 2", "import os\nkept = int(os.environ['RANK']) * 10")
    distrun("-N 2 -n 2 -o back", "back = kept + 1")
    assert shell.user_ns["back"] == [1, 11, 21, 31]


def test_last_expression_is_shown_per_rank_as_ipython_would(distrun, shell):
    """Cells go to the engines silent (no execute_input): the value is shown by engine_cells."""
    out = distrun("-f pytorch -N 2 -n 2", "import os\nr = int(os.environ['RANK'])\nr * 10")
    for r in range(4):
        assert f"Out: {r * 10}" in out.out
    assert "Out:" not in distrun("-N 2 -n 2", "r + 1;").out  # a trailing ; hides it
    out = distrun("-N 2 -n 2", "%time r\n(r,\n 2)")  # a line magic, a value over two lines
    assert "Wall time" in out.out and "Out: (3, 2)" in out.out
    out = distrun("-N 2 -n 2 -o seen", "seen = _")  # `_` is the last shown value, as in IPython
    assert shell.user_ns["seen"] == [(r, 2) for r in range(4)]
    # %%px on the same engines still shows its own value, once
    view = jupyter_dist.get_session().cluster.client[:]
    ar = view.execute("r + 100", silent=False, block=True)
    assert sorted(int(v["data"]["text/plain"]) for v in ar.execute_result) == [100, 101, 102, 103]
    assert not any(o for o in ar.outputs)


def test_users_cell_events_and_autoreload_see_distrun_cells(distrun, shell, tmp_path):
    """IPython fires no pre_run_cell/post_run_cell for the silent cells %%distrun sends: the
    engines fire both for them, so a user's hooks and %autoreload work as in a notebook."""
    distrun("-N 2 -n 2", "seen = []\nip = get_ipython()\n"
            "ip.events.register('pre_run_cell', pre := lambda info: seen.append(('pre', info.raw_cell)))\n"
            "ip.events.register('post_run_cell', post := lambda result: seen.append(('post', result.success)))")
    try:
        distrun("-N 2 -n 2 -o got", "got = list(seen)")
        for got in shell.user_ns["got"]:
            assert got[0] == ("post", True)  # the cell that registered them, as IPython does
            assert got[1][0] == "pre" and "got = list(seen)" in got[1][1] and len(got) == 2
        distrun("-N 2 -n 2 -o got", "got = list(seen)")
        assert all(len(g) == 4 and g[2] == ("post", True) for g in shell.user_ns["got"])
    finally:
        distrun("-N 2 -n 2", "ip.events.unregister('pre_run_cell', pre)\nip.events.unregister('post_run_cell', post)")

    mod = tmp_path / "jd_reloaded.py"
    mod.write_text("def f():\n    return 1\n")
    distrun("-N 2 -n 2 -o before", f"%load_ext autoreload\n%autoreload 2\nimport sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
            "import jd_reloaded\nbefore = jd_reloaded.f()")
    try:
        mod.write_text("def f():\n    return 2\n")
        st = mod.stat()
        os.utime(mod, (st.st_atime, st.st_mtime + 5))  # a new mtime even within the clock's resolution
        distrun("-N 2 -n 2 -o after", "after = jd_reloaded.f()")
        assert shell.user_ns["before"] == [1] * 4 and shell.user_ns["after"] == [2] * 4
    finally:
        distrun("-N 2 -n 2", f"%autoreload off\nsys.path.remove({str(tmp_path)!r})")


def test_flags_are_remembered(distrun, shell):
    distrun("-f mpi -N 2 -n 2", "pass")
    distrun("-o fw", "import os\nfw = os.environ['JUPYTER_DIST_FRAMEWORK']")
    assert shell.user_ns["fw"] == ["mpi"] * 4


def test_error_names_rank(distrun, shell, capsys):
    with pytest.raises(RankFailure) as info:
        shell.run_cell_magic(
            "distrun", "-f pytorch -N 2 -n 2",
            "import os\nprint('before the error', flush=True)\nif os.environ['RANK'] == '2':\n    raise ValueError('bad shard')\n",
        )
    out = capsys.readouterr()
    err = info.value
    assert err.failed == [2]
    assert "rank 2 failed first" in str(err) and "ValueError: bad shard" in str(err)
    text = "\n".join(err._render_traceback_())
    assert "rank 2 (node 1, local rank 0) failed first" in text
    assert "[rank 2|node 1] before the error" in out.out  # output printed just before the error is kept
    # the cluster is still usable
    distrun("-N 2 -n 2 -o ok", "ok = 1")
    assert shell.user_ns["ok"] == [1, 1, 1, 1]


def test_script_mode_expands_rank_vars(distrun, shell, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, os\n"
        "assert __name__ == '__main__'\n"
        "print('argv', sys.argv[1:], 'rank', os.environ['RANK'])\n"
    )
    out = distrun(f"-f pytorch -N 2 -n 2 {script} --local_rank $LOCAL_RANK --node ${{NODE_RANK}} --n $WORLD_SIZE")
    for r in range(4):
        assert f"argv ['--local_rank', '{r % 2}', '--node', '{r // 2}', '--n', '4'] rank {r}" in out.out


def test_ranks_filter_shows_only_rank0_but_logs_all(distrun, shell):
    out = distrun("-N 2 -n 2 --ranks 0", "import os\nprint('hello from', os.environ['RANK'])")
    assert "hello from 0" in out.out
    assert "hello from 1" not in out.out


def test_status_shows_ranks(shell, capsys):
    shell.run_line_magic("dist", "status")
    out = capsys.readouterr().out
    assert "engines: 4/4" in out
    assert "idle" in out


def test_warm_rerun_reuses_the_plan_until_something_it_depends_on_changes(distrun, shell, tmp_path, monkeypatch):
    from IPython.core.error import UsageError

    import jupyter_dist

    session = jupyter_dist.get_session()
    distrun("-f pytorch -N 2 -n 2 -o cwd", "import os\ncwd = os.getcwd()")
    plan = session._plan[1]
    distrun("-f pytorch -N 2 -n 2 -o cwd", "import os\ncwd = os.getcwd()")
    assert session._plan[1] is plan  # the same run again: checks and tables reused
    # a cell that does not compile is still refused before it reaches the ranks
    with pytest.raises(UsageError):
        shell.run_cell_magic("distrun", "-f pytorch -N 2 -n 2", "def broken(:\n")
    monkeypatch.chdir(tmp_path)
    distrun("-f pytorch -N 2 -n 2 -o cwd", "import os\ncwd = os.getcwd()")
    assert session._plan[1] is not plan and shell.user_ns["cwd"] == [str(tmp_path)] * 4
    plan = session._plan[1]
    session.cluster.rotate_master_port()  # as after a failed run
    distrun("-f pytorch -N 2 -n 2 -o port", "import os\nport = os.environ['MASTER_PORT']")
    assert session._plan[1] is not plan
    assert shell.user_ns["port"] == [str(session.cluster.master_port)] * 4
    script = tmp_path / "job.py"
    script.write_text("print('job ran')\n")
    distrun(f"-f pytorch -N 2 -n 2 {script}")
    script.unlink()
    with pytest.raises(UsageError, match="does not exist"):
        shell.run_line_magic("distrun", f"-f pytorch -N 2 -n 2 {script}")


def test_a_cell_that_destroys_its_group_runs_again(distrun, shell):
    """A torchrun-style cell ends with destroy_process_group() and leaves its DDP model in the
    namespace; run again on the warm engines it must not meet the old store (it hung before)."""
    cell = DDP_CELL + "dist.destroy_process_group()\n"
    port = jupyter_dist.get_session().cluster.master_port
    distrun("-f pytorch -N 2 -n 2 -o params --timeout 90", cell)
    assert jupyter_dist.get_session().cluster.master_port != port  # the next run gets a new one
    second = distrun("-f pytorch -N 2 -n 2 -o params --timeout 90", cell)
    assert "trained rank=3 world=4" in second.out
    p = shell.user_ns["params"]
    assert all(bool((x == p[0]).all()) for x in p)
    third = distrun("-f pytorch -N 2 -n 2 --timeout 90", DDP_CELL)  # and a cell that keeps its group
    assert "trained rank=3 world=4" in third.out


def test_every_rank_answers_with_its_stack_while_the_cell_runs(distrun, shell):
    """The ranks' agents answer from their own thread: the cell's main thread is busy meanwhile."""
    cluster = jupyter_dist.get_session().cluster
    got = {}

    def ask() -> None:
        time.sleep(2.0)
        t0 = time.monotonic()
        got["answers"] = cluster.agents.ask("stacks", timeout=3)
        got["took"] = time.monotonic() - t0

    asker = threading.Thread(target=ask)
    asker.start()
    distrun("-f pytorch -N 2 -n 2", "import time\ndef waiting():\n    time.sleep(5)\nwaiting()")
    asker.join()
    answers = got["answers"]
    print(f"stacks of 4 ranks while the cell ran: {got['took']:.3f} s")
    assert answers.missing == {}
    groups = group(answers.results)
    assert [g.ranks for g in groups] == [(0, 1, 2, 3)]
    assert groups[0].where == "time.sleep at <cell>:3", groups[0].frames
