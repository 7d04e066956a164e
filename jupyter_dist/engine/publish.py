"""A rank's data for the notebook (see `jupyter_dist.common.channel`): sent as a display message."""

from __future__ import annotations

from typing import Any

from IPython.display import publish_display_data

from jupyter_dist.common.channel import DATA_MIME, message


def publish(key: str, data: Any) -> None:
    """Send `data` to the notebook's view of this rank, under `key` (one of channel's keys)."""
    publish_display_data({DATA_MIME: message(key, data), "text/plain": ""})
