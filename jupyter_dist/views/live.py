"""A live area in the cell output: an ipywidget updated over its comm while a run goes.

Comm updates are not output messages, so nothing of the live state lands in the saved
notebook; what stays is what the caller prints or displays once the run is over.
"""

from __future__ import annotations

import html
from typing import Any


def in_kernel() -> bool:
    from IPython import get_ipython

    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


class LiveArea:
    """A `<pre>` block that can be rewritten in place; a no-op outside a kernel."""

    def __init__(self, placeholder: str = "jupyter-dist: live output") -> None:
        self.widget: Any = None
        if not in_kernel():
            return
        try:
            import ipywidgets as widgets
            from IPython.display import display
        except ImportError:
            return
        self.widget = widgets.HTML(value="")
        bundle = {
            "application/vnd.jupyter.widget-view+json": {
                "version_major": 2, "version_minor": 0, "model_id": self.widget.model_id,
            },
            "text/plain": placeholder,
        }
        display(bundle, raw=True)

    @property
    def active(self) -> bool:
        return self.widget is not None

    def set_text(self, text: str) -> None:
        if self.widget is not None:
            self.widget.value = f"<pre style='margin:0;max-height:30em;overflow:auto'>{html.escape(text)}</pre>"

    def close(self) -> None:
        if self.widget is not None:
            self.widget.close()
            self.widget = None
