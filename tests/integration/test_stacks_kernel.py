"""`%dist stacks` and the sidebar's Stacks button in a real kernel, while a %%distrun cell runs on
the main shell: the sidebar's comm and the magic both on a kernel subshell (ipykernel 7). Real
engines under Open MPI; the answer times are printed, never asserted."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kernel import execute, started_kernel

pytestmark = [pytest.mark.engines, pytest.mark.timeout(300)]

CELL = "%%distrun -f pytorch -N 1 -n 2\nimport time\ndef waiting():\n    time.sleep(12)\nwaiting()\n"


def test_stacks_from_the_sidebar_and_the_magic_on_a_subshell_while_a_cell_runs(capsys):
    with started_kernel() as (_km, kc):
        features = kc.kernel_info(reply=True, timeout=30)["content"].get("supported_features", [])
        if "kernel subshells" not in features:
            pytest.skip("this ipykernel has no subshells")
        execute(kc, f"import os; os.chdir({str(Path(__file__).parents[2])!r})\n%load_ext jupyter_dist").raise_error()
        execute(kc, "%%distrun -f pytorch -N 1 -n 2\nx = 1", timeout=180).raise_error()  # the engines up
        kc.control_channel.send(kc.session.msg("create_subshell_request", {}))
        subshell = kc.control_channel.get_msg(timeout=10)["content"]["subshell_id"]
        comm_id = uuid.uuid4().hex

        def on_subshell(msg_type: str, content: dict[str, Any]) -> str:
            msg = kc.session.msg(msg_type, content)
            msg["header"]["subshell_id"] = subshell
            kc.shell_channel.send(msg)
            return msg["header"]["msg_id"]

        on_subshell("comm_open", {"comm_id": comm_id, "target_name": "jupyter_dist",
                                  "data": {"type": "hello", "version": "1.2"}})
        running = kc.execute(CELL)
        time.sleep(4)  # the ranks are in the cell
        t0 = time.monotonic()
        on_subshell("comm_msg", {"comm_id": comm_id, "data": {"type": "stacks"}})
        button, button_s = "", None
        magic_id = None
        magic, magic_s = "", None
        cell_over_first = False  # the running cell went idle before both answers came
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (button_s is None or magic_s is None):
            try:
                msg = kc.get_iopub_msg(timeout=0.2)
            except Exception:
                continue
            content = msg["content"]
            if msg["msg_type"] == "comm_msg" and content.get("comm_id") == comm_id and content["data"]["type"] == "stacks":
                button, button_s = content["data"]["text"], time.monotonic() - t0
                t0 = time.monotonic()
                magic_id = on_subshell("execute_request", {"code": "%dist stacks", "silent": False,
                                                           "store_history": False, "user_expressions": {},
                                                           "allow_stdin": False, "stop_on_error": True})
            parent = msg["parent_header"].get("msg_id")
            if parent == running and msg["msg_type"] == "status" and content["execution_state"] == "idle":
                cell_over_first = True
            if magic_id and parent == magic_id and msg["msg_type"] == "stream":
                magic += content["text"]
            if magic_id and parent == magic_id and msg["msg_type"] == "status" and content["execution_state"] == "idle":
                magic_s = time.monotonic() - t0
        with capsys.disabled():
            print(f"\nthe sidebar's Stacks button while the cell ran: {button_s and button_s * 1000:.0f} ms"
                  f"\n%dist stacks on a subshell while the cell ran: {magic_s and magic_s * 1000:.0f} ms\n{magic}")
        assert not cell_over_first
        assert "ranks 0,1: time.sleep at <cell>:3" in button
        assert "ranks 0,1: time.sleep at <cell>:3" in magic
        reply = kc.get_shell_msg(timeout=60)  # the running cell's reply: it ran to its end meanwhile
        while reply["parent_header"].get("msg_id") != running:
            reply = kc.get_shell_msg(timeout=60)
        assert reply["content"]["status"] == "ok"
