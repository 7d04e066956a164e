"""The rank -> notebook channel, the per-rank files, and the entry that cell code calls on a rank."""

from __future__ import annotations

import pytest

from jupyter_dist import frameworks
from jupyter_dist.common import channel, files
from jupyter_dist.engine import entry
from jupyter_dist.engine.script import run_script
from jupyter_dist.run.output import split_relabelled


def test_a_message_is_found_in_a_display_and_only_there():
    content = {"data": {channel.DATA_MIME: channel.message(channel.EXIT, channel.ExitData(code=3)), "text/plain": ""}}
    assert channel.message_in(content) == {"key": "exit", "data": {"code": 3}}
    assert channel.message_in({"data": {"text/plain": "1"}}) is None
    assert channel.message_in({}) is None


def test_relabelled_lines_go_to_their_rank():
    lines = ["mine", channel.relabel(5, "worker five"), channel.relabel(5, "again"), "mine too"]
    assert split_relabelled(1, lines) == [(1, ["mine"]), (5, ["worker five", "again"]), (1, ["mine too"])]


def test_stack_and_crash_files(tmp_path):
    d = str(tmp_path)
    assert files.read_stack(d, 2) == files.read_crash(d, 2) == ""  # none written yet
    with open(files.stack_file(d, 2), "w") as f:
        f.write("Thread 0x1 (most recent call first):\n")
    with open(files.crash_file(d, 2), "w") as f:
        f.write("Fatal Python error: Segmentation fault\n")
    assert files.read_stack(d, 2).startswith("Thread")
    assert files.read_crash(d, 2).startswith("Fatal Python error")
    assert files.stack_file(d, 2) != files.stack_file(d, 3) != files.crash_file(d, 3)


def test_call_code_runs_through_the_bound_entry(tmp_path, monkeypatch):
    script, out = tmp_path / "job.py", tmp_path / "argv.txt"
    script.write_text(f"import sys\nopen({str(out)!r}, 'w').write(' '.join(sys.argv[1:]))\n")
    monkeypatch.setenv("RANK", "3")
    code = entry.call_code(entry.ENTRY.run_script, str(script), ["--rank", "$RANK"])
    assert code == f"__jupyter_dist__.run_script({str(script)!r}, ['--rank', '$RANK'])"
    namespace: dict[str, object] = {}
    entry.bind(namespace)
    exec(code, namespace)  # as a rank runs it: a cell in the user's namespace
    assert out.read_text() == "--rank 3"
    assert entry.call_code(run_script, "x.py", []) == "__jupyter_dist__.run_script('x.py', [])"
    assert entry.call_code(entry.ENTRY.run_torchrun, {"a": 1}, None) == "__jupyter_dist__.run_torchrun({'a': 1}, None)"


def test_only_the_entry_functions_have_call_code():
    with pytest.raises(ValueError, match="__jupyter_dist__"):
        entry.call_code(print, 1)


def test_bind_puts_the_entry_back():
    namespace: dict[str, object] = {entry.NAME: "overwritten"}
    entry.bind(namespace)
    assert namespace[entry.NAME] is entry.ENTRY


def test_framework_hooks_are_engine_functions():
    for fw in frameworks.registry().values():
        for hook in fw.engine_hooks:
            assert callable(hook) and hook.__module__.startswith("jupyter_dist.engine."), (fw.name, hook)
