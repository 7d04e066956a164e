"""engine/frameworks/patch.when_imported: a module is patched whole, never half-executed, also while
another thread imports it (engine/preload.py imports torch.distributed as the set-up hooks it)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from jupyter_dist.engine.frameworks.patch import when_imported

pytestmark = pytest.mark.timeout(30)

SLOW = "import time\nfirst = 1\ntime.sleep({delay})\nlast = 2\n"


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("jd_slow_")]:
        del sys.modules[name]


def write(module_dir: Path, name: str, delay: float) -> str:
    (module_dir / f"{name}.py").write_text(SLOW.format(delay=delay))
    return name


def seen_attrs(name: str) -> list[set[str]]:
    seen: list[set[str]] = []
    when_imported(name, lambda m: seen.append({a for a in ("first", "last") if hasattr(m, a)}))
    return seen


def test_a_module_imported_later_is_patched_after_it_ran(module_dir):
    name = write(module_dir, "jd_slow_later", 0)
    seen = seen_attrs(name)
    assert seen == []
    __import__(name)
    assert seen == [{"first", "last"}]


def test_a_module_loaded_already_is_patched_now(module_dir):
    name = write(module_dir, "jd_slow_loaded", 0)
    __import__(name)
    assert seen_attrs(name) == [{"first", "last"}]


def test_a_module_another_thread_is_importing_is_patched_once_it_is_whole(module_dir):
    name = write(module_dir, "jd_slow_racing", 0.5)
    importer = threading.Thread(target=__import__, args=(name,))
    importer.start()
    deadline = time.monotonic() + 5
    while name not in sys.modules and time.monotonic() < deadline:  # its body is running now
        time.sleep(0.001)
    assert name in sys.modules and not hasattr(sys.modules[name], "last")
    seen = seen_attrs(name)
    importer.join()
    assert seen == [{"first", "last"}]
