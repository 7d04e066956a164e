"""The value a `%%distrun` cell shows: its last expression's, through the display hook.

A silent cell (as `%%distrun` sends them) shows none by itself: `engine.cells` wraps the last
expression in a call to `show_value` (reached as `__jupyter_dist__.show_value`, engine.entry).
"""

from __future__ import annotations

from typing import Any

from IPython import get_ipython
from IPython.core.displayhook import DisplayHook


def ends_in_semicolon(code: str) -> bool:
    """IPython's rule for hiding a cell's value; code it cannot tokenize hides nothing."""
    try:
        return bool(DisplayHook.semicolon_at_end_of_expression(code))
    except Exception:  # noqa: BLE001 - a cell with magics may not tokenize as Python
        return False


def show_value(value: Any) -> None:
    """What IPython's display hook does with a cell's last value, less its `;` check (made by
    `ends_in_semicolon` on the cell's text: a silent cell leaves none in the history it reads)."""
    hook = get_ipython().displayhook
    hook.check_for_underscore()
    if value is None:
        return
    hook.start_displayhook()
    hook.write_output_prompt()
    format_dict, md_dict = hook.compute_format_data(value)
    hook.update_user_ns(value)
    hook.fill_exec_result(value)
    if format_dict:
        hook.write_format_data(format_dict, md_dict)
        hook.log_output(format_dict)
    hook.finish_displayhook()
