"""Crash files where the kernel's state folder is not the node's (engine/crash_records.py), on a real disk."""

from __future__ import annotations

import os
import tempfile

from jupyter_dist.common.files import crash_file
from jupyter_dist.engine import crash_records


def test_a_folder_the_node_can_write_is_kept(tmp_path):
    folder = str(tmp_path / "profiles" / "jd-1" / "stacks")
    assert crash_records.usable_folder(folder) == folder and os.path.isdir(folder)


def test_a_folder_the_node_cannot_make_falls_back_to_a_node_local_one(tmp_path):
    (tmp_path / "profiles").write_text("a file where the kernel's folder would be")
    got = crash_records.usable_folder(str(tmp_path / "profiles" / "jd-2" / "stacks"))
    assert got == os.path.join(tempfile.gettempdir(), f"jupyter-dist-{os.getuid()}", "jd-2", "stacks")
    with open(crash_file(got, 5), "w") as f:
        f.write("Fatal Python error: Aborted\n")
    # what a live rank of the node answers for a dead one (op `crash`)
    assert crash_records.crash_records({"ranks": [5, 6]}) == {"5": "Fatal Python error: Aborted\n", "6": ""}
    os.remove(crash_file(got, 5))
