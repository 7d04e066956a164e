"""The metrics' engine set-up hook: the end-of-cell flush, torch step counting, text progress bars.

Step counting needs torch's global optimizer hooks, set once torch is imported: at set-up if it
is, before a cell that imports it, and otherwise as soon as anything imports it (a script, a
module the cell calls), by an import hook (engine.frameworks.patch).

Apart from `engine.metrics` so that `import jupyter_dist` (which binds `report`) loads neither
IPython nor the engine's cell hooks in a process that is no engine, such as a torchrun worker.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from jupyter_dist.engine import metrics
from jupyter_dist.engine.cells import BEFORE_CELL, END_OF_CELL, add_hook
from jupyter_dist.engine.frameworks.patch import when_imported


def install() -> None:
    """Engine set-up hook: end-of-cell flush, torch step counting, and, before each cell, text
    progress bars (a widget bar made on a rank can never be seen)."""
    add_hook(END_OF_CELL, metrics.end_of_cell)
    metrics.watching()
    if not metrics.hook_torch():
        when_imported("torch", hook_torch_now)
    add_hook(BEFORE_CELL, _before_cell)
    # rich (Lightning's default bar where it is installed) takes an engine for a notebook: an Output
    # widget on the rank and an HTML display per redraw, each kept in the saved notebook (136 of them
    # for a 2-rank, 2-epoch fit)
    when_imported("rich.console", rich_as_text)


def rich_as_text(module: ModuleType) -> None:
    """Right after `rich.console` is imported: consoles made on a rank write text, not notebook
    displays (a live bar is then drawn when it stops, as a rank's stdout is no terminal)."""
    module._is_jupyter = lambda: False


def hook_torch_now(torch: ModuleType) -> None:
    """Right after torch's first import, wherever it happens."""
    metrics.hook_torch(load=True)


def _before_cell(cell: str) -> None:
    metrics.new_cell()
    if not metrics.torch_hooked() and ("torch" in sys.modules or _imports(cell, "torch")):
        metrics.hook_torch(load=True)
    if "tqdm" in cell:
        text_progress_bars()


def _imports(cell: str, module: str) -> bool:
    return f"import {module}" in cell or f"from {module}" in cell


def text_progress_bars() -> None:
    """On a rank, `tqdm.auto` would draw an ipywidgets bar whose updates go nowhere; use text."""
    if importlib.util.find_spec("tqdm") is None:
        return
    from tqdm import std  # optional: only when the cell uses tqdm

    for name in ("tqdm.auto", "tqdm.autonotebook"):
        try:
            mod = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a broken optional import is not ours to raise
            continue
        mod.tqdm, mod.trange = std.tqdm, std.trange

