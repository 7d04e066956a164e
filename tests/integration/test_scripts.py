"""Script mode with a launcher's contract, on real engines (1 node x 2 ranks, torch gloo).

Scripts written in the style of upstream examples (no upstream code): exit statuses as a launcher
reports them, a DDP training script run twice in warm engines with equal results, an edited helper
beside it seen on the next run, warnings shown on every run, `--fresh` in a child process.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest
from script_runs import recorded_sinks

import jupyter_dist
from jupyter_dist.errors import RankFailure

pytestmark = [pytest.mark.engines, pytest.mark.timeout(300)]

FLAGS = "-f pytorch -N 1 -n 2 --timeout 120"

EXIT = textwrap.dedent(
    """
    import os, sys
    print(f"rank {os.environ['RANK']} says bye", flush=True)
    code = sys.argv[1]
    sys.exit(None if code == "none" else int(code) if code.lstrip("-").isdigit() else code)
    """
)

UNITTEST = textwrap.dedent(
    """
    import sys
    import unittest

    MODE = sys.argv.pop(1)


    class Arithmetic(unittest.TestCase):
        def test_sum(self):
            self.assertEqual(sum([1, 2, 3]), 6)

        def test_mode(self):
            self.assertEqual(MODE, "pass")


    if __name__ == "__main__":
        unittest.main()
    """
)

HELPER = textwrap.dedent(
    """
    import torch

    VERSION = {version}


    def make_model():
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    """
)

DDP = textwrap.dedent(
    """
    import argparse
    import json
    import warnings

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ddp_helper


    def main():
        parser = argparse.ArgumentParser(description="toy DDP regression")
        parser.add_argument("--steps", type=int, default=30)
        parser.add_argument("--out", required=True)
        args = parser.parse_args()

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        torch.manual_seed(0)
        model = DDP(ddp_helper.make_model())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(rank)
        for _ in range(args.steps):
            x = torch.randn(16, 4, generator=gen)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        warnings.warn("toy DDP: this warning shows on every run")
        weights = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
        with open(args.out, "w") as f:
            json.dump({"loss": float(loss), "weights": weights, "version": ddp_helper.VERSION}, f)
        print(f"rank {rank} loss {float(loss):.6f}", flush=True)
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
    """
)


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    d = tmp_path_factory.mktemp("scripts")
    for name, text in (("exit.py", EXIT), ("tests.py", UNITTEST), ("ddp.py", DDP),
                       ("ddp_helper.py", HELPER.format(version=1))):
        (d / name).write_text(text)
    return d


@pytest.fixture
def sinks(shell):
    """The sinks of the runs in the test (their metrics)."""
    with recorded_sinks() as made:
        yield made


@pytest.mark.parametrize("code", ["0", "none", "False"])
def test_exit_success(distrun, scripts, code):
    arg = "False" if code == "False" else code
    script = scripts / "exit.py"
    if code == "False":
        script = scripts / "exit_false.py"
        script.write_text("import sys\nprint('done', flush=True)\nsys.exit(False)\n")
    out = distrun(f"{FLAGS} {script} {arg}")
    text = out.out + out.err
    assert "To exit: use 'exit'" not in text and "SystemExit" not in text


def test_exit_status_is_reported_as_such(distrun, scripts):
    with pytest.raises(RankFailure) as info:
        distrun(f"{FLAGS} {scripts / 'exit.py'} 3")
    err = info.value
    assert err.summary.startswith("ranks 0, 1 exited with status 3; failed ranks: ")
    report = "\n".join(err.report)
    assert "its script exited with status 3" in report
    assert "Traceback" not in report and "waiting for rank" not in report and "ScriptExit" not in report
    print("\n".join(err._render_traceback_()))


def test_exit_with_a_message_is_status_1(distrun, scripts):
    with pytest.raises(RankFailure) as info:
        distrun(f"{FLAGS} {scripts / 'exit.py'} giving-up")
    assert info.value.summary.startswith("ranks 0, 1 exited with status 1")


def test_unittest_main_passing_and_failing(distrun, scripts):
    out = distrun(f"{FLAGS} {scripts / 'tests.py'} pass")
    assert out.err.count("OK") >= 2 and "Ran 2 tests" in out.err
    with pytest.raises(RankFailure) as info:
        distrun(f"{FLAGS} {scripts / 'tests.py'} fail")
    assert info.value.summary.startswith("ranks 0, 1 exited with status 1; failed ranks: ")


def _results(d) -> list[dict]:
    return [json.loads((d / f"out_{r}.json").read_text()) for r in range(2)]


def test_ddp_script_twice_equal_then_edited_helper(distrun, scripts, sinks):
    runs = []
    for _ in range(2):
        out = distrun(f"{FLAGS} {scripts / 'ddp.py'} --steps 30 --out {scripts}/out_$RANK.json")
        assert out.err.count("UserWarning: toy DDP") == 2  # each rank, each run
        runs.append(_results(scripts))
    assert runs[0] == runs[1]
    assert runs[0][0]["weights"] == runs[0][1]["weights"]  # DDP: the ranks agree
    # 30 optimizer steps counted on each rank, each run (the script calls no report())
    for sink in sinks:
        assert [len(sink.metrics.ranks[r].auto_t) for r in range(2)] == [30, 30]
    helper = scripts / "ddp_helper.py"
    helper.write_text(HELPER.format(version=2))
    st = helper.stat()
    os.utime(helper, (st.st_atime, st.st_mtime + 2))
    distrun(f"{FLAGS} {scripts / 'ddp.py'} --steps 30 --out {scripts}/out_$RANK.json")
    third = _results(scripts)
    assert [r["version"] for r in third] == [2, 2]
    assert third[0]["weights"] == runs[0][0]["weights"]


def test_fresh_runs_in_a_child_process(distrun, scripts, sinks):
    pid_script = scripts / "pid.py"
    pid_script.write_text("import os, sys\nprint('pid', os.getpid(), 'parent', os.getppid(), flush=True)\n"
                          "sys.exit(int(sys.argv[1]))\n")
    out = distrun(f"{FLAGS} --fresh {pid_script} 0")
    engines = {e.pid for e in jupyter_dist.get_session().cluster.engines}
    lines = [line for line in out.out.splitlines() if " pid " in line]
    assert len(lines) == 2
    for line in lines:
        pid, parent = int(line.split()[-3]), int(line.split()[-1])
        assert parent in engines and pid not in engines
    with pytest.raises(RankFailure) as info:
        distrun(f"{FLAGS} --fresh {pid_script} 4")
    assert info.value.summary.startswith("ranks 0, 1 exited with status 4; failed ranks: ")
    # training in the child: its result equals the warm run's, its steps are counted
    distrun(f"{FLAGS} {scripts / 'ddp.py'} --steps 30 --out {scripts}/out_$RANK.json")
    distrun(f"{FLAGS} --fresh {scripts / 'ddp.py'} --steps 30 --out {scripts}/fresh_$RANK.json")
    fresh = [json.loads((scripts / f"fresh_{r}.json").read_text()) for r in range(2)]
    assert fresh == _results(scripts)
    assert [len(sinks[-1].metrics.ranks[r].auto_t) for r in range(2)] == [30, 30]


ATEXIT = textwrap.dedent(
    """
    import atexit, os, threading, time

    rank = os.environ["RANK"]


    @atexit.register
    def goodbye():
        print(f"rank {rank} atexit ran", flush=True)


    atexit.register(print, f"rank {rank} registered second, runs first", flush=True)
    if os.environ.get("LINGER"):
        threading.Thread(target=time.sleep, args=(1.5,), name="lingering").start()
    print(f"rank {rank} main done", flush=True)
    """
)


def test_atexit_handlers_run_as_the_script_ends(distrun, scripts):
    """Each run's handlers run once, at its end, last registered first (not piled up in the engine)."""
    script = scripts / "bye.py"
    script.write_text(ATEXIT)
    for _ in range(2):
        out = distrun(f"{FLAGS} {script}").out
        for r in range(2):
            lines = [line for line in out.splitlines() if line.startswith(f"[rank {r}]")]
            assert [line.split("] ", 1)[1] for line in lines] == [
                f"rank {r} main done", f"rank {r} registered second, runs first", f"rank {r} atexit ran"], out


def test_a_run_that_cannot_be_made_clean_says_why(distrun, scripts):
    """A script leaving a thread running: one line per rank names it and suggests --fresh; none otherwise."""
    script = scripts / "bye.py"
    script.write_text(ATEXIT)
    quiet = distrun(f"{FLAGS} {script}")
    assert "cannot be made clean" not in quiet.err
    out = distrun(f"{FLAGS} --env LINGER=1 {script}")
    notes = [line for line in out.err.splitlines() if "cannot be made clean" in line]
    print("\n".join(notes))
    assert len(notes) == 2 and all("1 thread(s) running (lingering)" in n and "--fresh" in n for n in notes)


def test_restart_with_no_cluster_starts_one(distrun, shell, scripts, capsys):
    """The issue's point 2: with the engines gone (here stopped; there given up after a rank would not
    stop), `%dist restart` starts them afresh in the last run's shape instead of "no cluster is running"."""
    distrun(f"{FLAGS} {scripts / 'exit.py'} 0")
    session = jupyter_dist.get_session()
    session.cluster.stop()
    shell.run_line_magic("dist", "restart")
    assert "no cluster was running: started one (2 engines)" in capsys.readouterr().out
    assert session.cluster.shape is not None and session.cluster.shape.world_size == 2
    distrun(f"{FLAGS} {scripts / 'exit.py'} 0")  # and it runs
