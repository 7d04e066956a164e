"""The engine-side cell hooks' pure parts: which value a silent %%distrun cell shows."""

from __future__ import annotations

import ast

import pytest

from jupyter_dist.engine import cells as engine_cells
from jupyter_dist.engine.cells import CELL_LABEL, ShowLastValue, request
from jupyter_dist.engine.show import ends_in_semicolon


@pytest.fixture
def armed(monkeypatch):
    def arm(code: str) -> None:
        monkeypatch.setitem(engine_cells._state, "code", code)
        monkeypatch.setitem(engine_cells._state, "show_value", True)

    return arm


def shown(code: str) -> tuple[ast.Module, str]:
    tree = ShowLastValue().visit(ast.parse(code))
    return tree, ast.unparse(tree)


def test_the_last_expression_is_wrapped_where_it_was(armed):
    armed("x = 1\n(x,\n 2)")
    tree, text = shown("x = 1\n(x,\n 2)")
    assert text.splitlines()[-1] == "__jupyter_dist__.show_value((x, 2))"
    for node in ast.walk(tree.body[-1]):
        if hasattr(node, "lineno"):
            assert node.lineno >= 2  # a traceback points at the user's lines, not at line 1
    compile(tree, "<cell>", "exec")


def test_only_the_first_module_after_the_cell_starts(armed):
    armed("1 + 1")
    assert "show_value" in shown("1 + 1")[1]
    assert shown("1 + 1")[1] == "1 + 1"  # a cell magic's body, transformed again: left alone


@pytest.mark.parametrize("code", ["x = 1", "1 + 1;", "1 + 1  ;  # hidden", "def f():\n    return 1", ""])
def test_nothing_to_show(armed, code):
    armed(code)
    assert "show_value" not in shown(code)[1]


def test_not_armed_leaves_every_cell_alone(monkeypatch):
    monkeypatch.setitem(engine_cells._state, "show_value", False)
    assert shown("1 + 1")[1] == "1 + 1"


def test_semicolon_rule_is_ipythons():
    assert ends_in_semicolon("a;\n# comment\n")
    assert not ends_in_semicolon("a; b")
    assert not ends_in_semicolon("'unterminated")  # cannot tokenize: shows


class FakeKernel:
    def __init__(self, parent):
        self.parent = parent

    def get_parent(self, channel):
        assert channel == "shell"
        return self.parent


class FakeShell:
    def __init__(self, parent):
        self.kernel = FakeKernel(parent)


def test_request_tells_distrun_cells_from_others():
    ours = {"metadata": {"label": CELL_LABEL}, "content": {"code": "1", "silent": True}}
    assert request(FakeShell(ours)) == ("1", True)
    px = {"metadata": {"label": None}, "content": {"code": "2", "silent": False}}
    assert request(FakeShell(px)) == ("2", False)
    loud = {"metadata": {"label": CELL_LABEL}, "content": {"code": "3", "silent": False}}
    assert request(FakeShell(loud)) == ("3", False)  # IPython shows a loud cell's value itself
    assert request(FakeShell({})) == ("", False)
    assert request(object()) == ("", False)
