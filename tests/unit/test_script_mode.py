"""Script mode's pure parts and in-process pieces: exit statuses, their reports, step counting through
wrapped optimizers, the resets between runs, input() answered through a real agent, --fresh's flag."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import warnings

import pytest
from IPython.core.error import UsageError

from jupyter_dist.cluster.agents import AgentAddress, RankAgents
from jupyter_dist.engine import agent, script_input, script_reset
from jupyter_dist.engine import metrics as m
from jupyter_dist.engine.frameworks.torchrun_agent import failure_message
from jupyter_dist.engine.script_run import ScriptExit, exit_status, run_warm
from jupyter_dist.plan.defaults import RunDefaults
from jupyter_dist.plan.layout import RankPlace
from jupyter_dist.plan.spec import parse_args, resolve
from jupyter_dist.run import failures
from jupyter_dist.run.session import script_code
from jupyter_dist.run.stdin import answer_input

pytestmark = pytest.mark.timeout(60)


# -- exit statuses -------------------------------------------------------------------------

@pytest.mark.parametrize(("code", "status"), [(0, 0), (None, 0), (False, 0), (True, 1), (3, 3), (-1, 255), (256, 0)])
def test_exit_status_as_a_process_exits(code, status):
    assert exit_status(code) == status


def test_exit_with_a_message_prints_it_and_is_1(capsys):
    assert exit_status("no data") == 1
    assert capsys.readouterr().err == "no data\n"


class RemoteError(Exception):
    """Stands in for ipyparallel's RemoteError (a name and a value), as tests/unit/test_failures.py's."""

    def __init__(self, ename: str, evalue: str) -> None:
        super().__init__(evalue)
        self.ename, self.evalue = ename, evalue

    def render_traceback(self) -> list[str]:
        return ["Traceback (most recent call last):", "  ...", f"{self.ename}: {self.evalue}"]


def place(rank: int) -> RankPlace:
    return RankPlace(rank, 0, rank, "127.0.0.1")


def test_script_exit_is_reported_as_an_exit_status_not_a_traceback():
    assert str(ScriptExit(3)) == "exit status 3" and ScriptExit.__name__ == failures.SCRIPT_EXIT
    status = failures.from_error(place(1), RemoteError("ScriptExit", "exit status 3"), 1.0)
    assert (status.what, status.exit_code, status.traceback, status.died) == ("status", 3, (), False)
    other = failures.from_error(place(0), RemoteError("ScriptExit", "exit status 3"), 2.0)
    waited = failures.from_error(place(2), RemoteError("RuntimeError", "connection closed"), 3.0)
    err = failures.rank_failure([status, other, waited], [3])
    assert err.summary == "ranks 0, 1 exited with status 3; failed ranks: 1, 0, 2"
    report = "\n".join(err.report)
    assert "rank 1 (node 0, local rank 1) failed first:\nits script exited with status 3" in report
    assert "rank 0 (node 0, local rank 0): its script exited with status 3" in report
    assert "RuntimeError: connection closed" in report  # the one that raised is shown as before
    assert report.count("waiting for rank 1") == 1  # only the rank that raised after it is asked about
    alone = failures.rank_failure([status], [0])
    assert alone.summary == "rank 1 exited with status 3; failed ranks: 1"


def test_a_warm_run_ends_with_its_exit_status(tmp_path, monkeypatch):
    monkeypatch.setattr(script_reset, "_state", {"mtimes": {}})
    script = tmp_path / "ends.py"
    for body, status in (("import sys; sys.exit(0)", 0), ("import unittest; unittest.main(argv=['x'])", 0),
                         ("raise SystemExit(7)", 7), ("print('done')", 0)):
        script.write_text(body + "\n")
        assert run_warm(str(script), []) == status


# -- torchrun: every failed worker, first by time -------------------------------------------

def test_torchrun_failure_names_every_failed_worker_first_by_time(tmp_path):
    for local, stamp, text in ((0, 9, "RuntimeError: peer gone"), (1, 5, "ValueError: bad")):
        err = tmp_path / "none_x" / "attempt_0" / str(local) / "error.json"
        err.parent.mkdir(parents=True)
        err.write_text(json.dumps({"message": {"message": text, "extraInfo": {"timestamp": str(stamp)}}}))
    assert failure_message(str(tmp_path), [], 0, 2, 1) == (
        "torchrun worker rank 1 (node 0, local rank 1) failed: ValueError: bad; "
        "then worker rank 0 (local rank 0): RuntimeError: peer gone", True)


# -- step counting ---------------------------------------------------------------------------

@pytest.fixture
def steps(monkeypatch):
    torch = pytest.importorskip("torch")
    clock = {"t": 1000.0}
    monkeypatch.setattr(m, "_now", lambda: clock.__setitem__("t", clock["t"] + 0.01) or clock["t"])
    monkeypatch.setattr(m, "_rows", [])
    monkeypatch.setattr(m, "_auto", [])
    monkeypatch.setattr(m, "_next_flush", 0.0)
    monkeypatch.setattr(m, "_reported", False)
    monkeypatch.setattr(m, "_state", {**m._state, "auto_opt": None, "torch_hook": None, "sender": lambda p: None,
                                      "watching": True, "depth": 0, "counts": {}, "others": {}})
    assert m.hook_torch(load=True)
    yield torch
    m._state["torch_hook"].remove()


def test_a_wrapper_calling_its_base_step_counts_once(steps):
    torch = steps

    class Wrapped(torch.optim.SGD):  # as Horovod's DistributedOptimizer: a subclass whose step calls the base's
        def step(self, closure=None):
            return super().step(closure)

    p = torch.nn.Parameter(torch.zeros(2))
    opt = Wrapped([p], lr=0.1)
    for _ in range(5):
        p.grad = torch.ones(2)
        opt.step()
    _, payload = m.end_of_cell()
    assert len(payload["auto_t"]) == 5


def test_the_optimizer_stepped_most_is_counted(steps):
    torch = steps
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.ones(2)
    raw = torch.optim.SGD([p], lr=0.1, momentum=0.5)
    raw.step()  # as hvd.broadcast_optimizer_state steps the optimizer before it is wrapped
    wrapped = torch.optim.SGD([p], lr=0.1, momentum=0.5)
    for _ in range(10):
        wrapped.step()
    _, payload = m.end_of_cell()
    assert len(payload["auto_t"]) == 10


# -- resets between runs ---------------------------------------------------------------------

def test_an_edited_module_beside_the_script_is_imported_anew(tmp_path, monkeypatch):
    monkeypatch.setattr(script_reset, "_state", {"mtimes": {}})
    (tmp_path / "jd_helper_mod.py").write_text("VALUE = 1\n")
    script = tmp_path / "main.py"
    script.write_text("import jd_helper_mod\nimport builtins\nbuiltins._jd_seen = jd_helper_mod.VALUE\n")
    import builtins

    try:
        run_warm(str(script), [])
        assert builtins._jd_seen == 1
        run_warm(str(script), [])  # unchanged: the module object is kept
        kept = sys.modules["jd_helper_mod"]
        run_warm(str(script), [])
        assert sys.modules["jd_helper_mod"] is kept
        (tmp_path / "jd_helper_mod.py").write_text("VALUE = 2\n")
        st = os.stat(tmp_path / "jd_helper_mod.py")
        os.utime(tmp_path / "jd_helper_mod.py", (st.st_atime, st.st_mtime + 2))
        run_warm(str(script), [])
        assert builtins._jd_seen == 2
    finally:
        sys.modules.pop("jd_helper_mod", None)
        vars(builtins).pop("_jd_seen", None)


def test_warnings_env_cwd_and_temp_folder_are_fresh_each_run(tmp_path, monkeypatch):
    monkeypatch.setattr(script_reset, "_state", {"mtimes": {}})
    monkeypatch.delenv("JD_SCRIPT_SET", raising=False)
    out = tmp_path / "seen.txt"
    script = tmp_path / "warns.py"
    script.write_text(
        "import os, tempfile, warnings\n"
        "def f():\n    warnings.warn('shown every run', UserWarning)\n"
        f"with open({str(out)!r}, 'a') as seen:\n"
        "    seen.write(tempfile.gettempdir() + ' ' + os.environ.get('JD_SCRIPT_SET', '-') + '\\n')\n"
        "os.environ['JD_SCRIPT_SET'] = '1'\n"
        "os.chdir('/')\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "f()\n")
    cwd, filters = os.getcwd(), list(warnings.filters)
    shown = []
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        old_showwarning = warnings.showwarning
        warnings.showwarning = lambda message, *a, **k: shown.append(str(message))
        try:
            run_warm(str(script), [])
            run_warm(str(script), [])
        finally:
            warnings.showwarning = old_showwarning
    assert [w for w in shown if w == "shown every run"] == ["shown every run", "shown every run"]
    (first_tmp, first_env), (second_tmp, second_env) = (line.split() for line in out.read_text().splitlines())
    assert first_env == second_env == "-" and "JD_SCRIPT_SET" not in os.environ
    assert first_tmp != second_tmp and not os.path.exists(first_tmp) and tempfile.gettempdir() != first_tmp
    assert os.getcwd() == cwd and warnings.filters == filters


# -- input() ---------------------------------------------------------------------------------

def test_input_elsewhere_than_rank_0_is_eof():
    with script_input.asking_notebook(rank=1), pytest.raises(EOFError):
        input("? ")


def test_the_notebook_answer_reaches_the_waiting_input_through_the_agent():
    agents = RankAgents()
    host, port = agent.start(agents.token)
    agents.addresses[0] = AgentAddress(host, port)
    agent.register("input", script_input.answer)
    event, box = threading.Event(), []
    script_input._waiting[41] = (event, box)
    try:
        asked = []
        problem = answer_input(agents, 0, {"id": 41, "prompt": "n? "}, ask=lambda p: asked.append(p) or "12")
        assert problem is None and asked == ["n? "] and event.is_set() and box == [{"id": 41, "text": "12"}]
        # end of input: no text, which the rank turns into EOFError; a late answer finds no one waiting
        box.clear()
        assert answer_input(agents, 0, {"id": 41, "prompt": ""}, ask=lambda p: None) is None
        assert box == [{"id": 41}]
    finally:
        script_input._waiting.pop(41, None)
    assert script_input.answer({"id": 41, "text": "late"}) is False


# -- --fresh ---------------------------------------------------------------------------------

def make(line: str):
    return resolve(parse_args(line), RunDefaults())


def test_fresh_flag():
    spec = make("--fresh train.py --lr 0.1")
    assert spec.fresh and spec.script == "train.py" and spec.script_args == ("--lr", "0.1")
    assert script_code(spec).endswith("['--lr', '0.1'], True)")
    assert not make("train.py --fresh").fresh  # after the script: the script's own argument
    with pytest.raises(UsageError, match="--fresh runs a script in a new process"):
        make("--fresh")
    with pytest.raises(UsageError, match="--fresh is not needed with -f torchrun"):
        make("-f torchrun --fresh train.py")
