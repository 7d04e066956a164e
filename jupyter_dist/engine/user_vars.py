"""`-o NAME`: a rank's variable, brought back to the notebook after the run."""

from __future__ import annotations

import pickle
from typing import Any

from IPython import get_ipython

_MISSING = object()


def fetch_user(name: str) -> tuple[str, Any]:
    """('ok', value), ('missing', None) or ('unsendable', reason)."""
    shell = get_ipython()
    namespace = shell.user_ns if shell is not None else {}
    value = namespace.get(name, _MISSING)
    if value is _MISSING:
        return ("missing", None)
    try:
        pickle.dumps(value)
    except Exception as e:  # noqa: BLE001 - any pickling failure is reported, not raised
        return ("unsendable", f"{type(e).__name__}: {e}")
    return ("ok", value)
