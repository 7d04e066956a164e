"""The rules of docs/architecture.md that import-linter does not check (it checks the layers).

Each test reads the package's source with `ast`; nothing is imported or started.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "jupyter_dist"
MAX_LINES = 400
# third-party packages a function may import where it needs them: heavy, or optional extras
HEAVY = {"torch", "tensorflow", "matplotlib", "numpy", "ipywidgets", "ipyparallel", "deepspeed", "lightning",
         "pytorch_lightning", "transformers", "accelerate", "horovod", "mpi4py", "pynvml", "tqdm", "comm",
         "IPython", "psutil", "traitlets", "jupyter_client", "zmq", "tf_keras", "keras"}


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "labextension" not in p.parts)


def name_of(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


def test_no_module_over_the_limit() -> None:
    long = {name_of(p): n for p in modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def top_level_imports(tree: ast.Module) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


@pytest.mark.parametrize("path", sorted((PACKAGE / "common").glob("*.py")), ids=lambda p: p.name)
def test_common_needs_the_standard_library_alone(path: Path) -> None:
    tree = ast.parse(path.read_text())
    outside = [m for m in top_level_imports(tree)
               if m.split(".")[0] not in sys.stdlib_module_names and m != "__future__"
               and not m.startswith("jupyter_dist.common")]
    assert not outside, f"{name_of(path)} imports {outside}"


def imports_inside_functions(tree: ast.Module) -> list[tuple[int, str]]:
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                found += [(node.lineno, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                found.append((node.lineno, "." * node.level + (node.module or "")))
    return found


def test_imports_inside_functions_are_for_heavy_optional_packages_only() -> None:
    bad = []
    # the package's root is exempt: `import jupyter_dist` on a rank (for `report`) must not load the
    # kernel side, so `load_ipython_extension` and `panel` import it when first called
    for path in [p for p in modules() if p != PACKAGE / "__init__.py"]:
        for line, module in imports_inside_functions(ast.parse(path.read_text())):
            top = module.split(".")[0]
            if module.startswith(".") or top == "jupyter_dist" or (top not in HEAVY and top not in sys.stdlib_module_names):
                bad.append(f"{name_of(path)}:{line} imports {module}")
    assert not bad, "imports of the package inside functions:\n" + "\n".join(bad)


def test_engine_code_is_reached_by_reference_not_by_strings() -> None:
    """No "jupyter_dist.x:function" hook strings and no `__import__("jupyter_dist...")` code strings."""
    bad = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
                if ("__import__(" in text and "jupyter_dist" in text) or (
                        text.startswith("jupyter_dist.") and ":" in text and " " not in text):
                    bad.append(f"{name_of(path)}:{node.lineno}: {text[:60]!r}")
    assert not bad, "\n".join(bad)
