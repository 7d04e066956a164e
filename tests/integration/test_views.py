"""Per-rank output, metrics and charts on real engines: one 2 nodes x 2 processes cluster for the module
(the --scaling test, last, resizes it)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from IPython.utils.capture import capture_output
from kernel import execute, started_kernel

import jupyter_dist
from jupyter_dist.cluster.profile import state_dir
from jupyter_dist.views.live_output import LiveTextSink

pytestmark = [pytest.mark.engines, pytest.mark.timeout(240)]

# a 1x1 PNG, so a rank can display an image without drawing one
PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="


def last_log_dir() -> Path:
    return max(state_dir().glob("logs/**/rank-0.log"), key=lambda p: p.stat().st_mtime).parent


def captured(shell, flags: str, cell: str):
    with capture_output() as cap:
        shell.run_cell_magic("distrun", flags, textwrap.dedent(cell))
    return cap


# a pandas-like table: displays as an HTML table beside its text (pandas itself is not a dependency)
TABLE_CLASS = """
class Table:
    def _repr_html_(self):
        return "<table><tr><th>step</th><th>loss</th></tr><tr><td>29</td><td>0.033</td></tr></table>"
    def __repr__(self):
        return "step loss / 29 0.033"
"""

KERNEL_CELL = "%%distrun -f pytorch -N 1 -n 2" + TABLE_CLASS + """
import os, time, jupyter_dist
from tqdm.auto import tqdm
r = int(os.environ["RANK"])
print("hello from", r)
for i in tqdm(range(30)):
    time.sleep(0.03)
    jupyter_dist.report(step=i, samples=8, loss=1.0 / (i + 1))
if r == 1:
    from IPython.display import display
    display(Table())
    time.sleep(1)  # the live view draws it before the run ends
"""


def test_live_view_in_a_real_kernel():
    """Runs first, with its own kernel and cluster, stopped before the module's cluster starts."""
    with started_kernel() as (_, kc):
        execute(kc, "%load_ext jupyter_dist")
        msgs = execute(kc, KERNEL_CELL, timeout=180, comms=True).messages
    errors = [m["content"]["traceback"] for m in msgs if m["msg_type"] == "error"]
    assert not errors, "\n".join(errors[0])
    shown = [m["content"]["data"] for m in msgs if m["msg_type"] == "display_data"]
    views = [d for d in shown if d.get("text/plain") == "jupyter-dist: live output of the ranks"]
    assert len(views) == 1 and "application/vnd.jupyter.widget-view+json" in views[0]
    states = [m["content"]["data"].get("state", {}) for m in msgs if m["msg_type"] in ("comm_open", "comm_msg")]
    assert any(st.get("titles") == ["all ranks", "rank 0", "rank 1"] for st in states)
    live = [st["value"] for st in states if isinstance(st.get("value"), str)]
    assert any("hello from 1" in v and "[rank 1]" in v for v in live)  # the all-ranks tab, streamed
    assert any("%|" in v and "30/30" not in v for v in live)  # the tqdm bar while it runs
    text = "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream")
    for r in range(2):
        assert f"[rank {r}] hello from {r}" in text
        assert sum(line.startswith(f"[rank {r}] !") and "30/30" in line for line in text.splitlines()) == 1
    # the metrics chart (a run past resources_view's first draw also saves its PNG, with no text/plain)
    assert [d["text/plain"] for d in shown if "image/png" in d and "text/plain" in d] == [
        "<jupyter-dist chart: samples/s by rank and their sum; loss by step; 2 rank(s)>"]
    assert "run summary: samples/s from report(), 2 rank(s)" in text
    # the table: drawn live under rank 1, then kept after the run, after the rank's label
    assert any("<table>" in v and "[rank 1]" in v for v in live)
    tables = [d for d in shown if "<table>" in d.get("text/html", "")]
    assert len(tables) == 1 and tables[0]["text/plain"] == "step loss / 29 0.033"
    assert "[rank 1] display:" in text
    # the engines' start: engines registered of total and the time, live, then one line
    assert any(re.search(r"starting engines: [0-2]/2 registered \(\d+\.\d s\)", v) for v in live)
    assert re.search(r"jupyter-dist: 2 engines started in \d+\.\d s", text)
    # closed views are left empty: a headless run saves every widget's last state (HTML reports draw it)
    values: dict[str, list[str]] = {}
    for m in msgs:
        if m["msg_type"] in ("comm_open", "comm_msg") and "value" in m["content"]["data"].get("state", {}):
            values.setdefault(m["content"]["comm_id"], []).append(m["content"]["data"]["state"]["value"])
    progress = [v for v in values.values() if any("starting engines" in x for x in v if isinstance(x, str))]
    assert progress and all(v[-1] == "" for v in progress)
    assert all(v[-1] in ("", b"") for v in values.values() if any(isinstance(x, str) and "hello from" in x for x in v))


def test_every_line_of_every_rank_labelled_in_order(shell):
    cap = captured(shell, "-f pytorch -N 2 -n 2", """
        import os, sys
        r = int(os.environ["RANK"])
        for i in range(60):
            print(f"r{r} line {i}", flush=(i % 7 == 0))
            if i % 20 == 0:
                print(f"r{r} warn {i}", file=sys.stderr)
        """)
    for r in range(4):
        label = f"[rank {r}|node {r // 2}]"
        mine = [line for line in cap.stdout.splitlines() if line.startswith(label)]
        assert mine == [f"{label} r{r} line {i}" for i in range(60)]
        assert f"{label} r{r} warn 40" in cap.stderr
        log = (last_log_dir() / f"rank-{r}.log").read_text().splitlines()
        assert [x for x in log if " line " in x] == [f"r{r} line {i}" for i in range(60)]
        assert f"[stderr] r{r} warn 20" in log


def test_rank_image_and_tqdm_bar(shell):
    cap = captured(shell, "-N 2 -n 2", TABLE_CLASS + textwrap.dedent(f"""
        import os, base64, time
        from tqdm.auto import tqdm
        r = int(os.environ["RANK"])
        for i in tqdm(range(15), desc=f"rank{{r}}"):
            time.sleep(0.02)
        from IPython.display import Image, display
        if r == 1:
            display(Image(data=base64.b64decode("{PNG_B64}")))
        if r == 2:
            display(Table())
        print("after", r)
        """))
    images = [o for o in cap.outputs if "image/png" in o.data]
    assert len(images) == 1
    assert "[rank 1|node 0] display:" in cap.stdout
    tables = [o.data for o in cap.outputs if "<table>" in o.data.get("text/html", "")]
    assert len(tables) == 1 and tables[0]["text/plain"] == "step loss / 29 0.033"
    assert "[rank 2|node 1] display:" in cap.stdout
    for r in range(4):
        bars = [line for line in cap.stderr.splitlines() if line.startswith(f"[rank {r}|") and f"rank{r}" in line]
        assert len(bars) == 1 and "100%" in bars[0] and "\r" not in bars[0]  # once, in its final state
        log = (last_log_dir() / f"rank-{r}.log").read_text().splitlines()
        assert sum("100%" in x for x in log) == 1 and f"after {r}" in log


def test_a_bar_redrawn_without_newlines_arrives_once_in_its_final_state(shell):
    # thousands of redraws in a few stream messages (run/streams.py, LineBuffer.feed): the bar's state
    # only is kept between messages, and every whole line around it is in the log
    cap = captured(shell, "-N 2 -n 2", """
        import os, sys
        r = int(os.environ["RANK"])
        print(f"r{r} before")
        for i in range(5001):
            sys.stderr.write(f"\\rr{r} bar {i}/5000")
        sys.stderr.write("\\n")
        print(f"r{r} after")
        """)
    for r in range(4):
        label = f"[rank {r}|node {r // 2}]"
        assert [line for line in cap.stderr.splitlines() if line.startswith(label)] == [f"{label} r{r} bar 5000/5000"]
        log = (last_log_dir() / f"rank-{r}.log").read_text().splitlines()
        # order is kept within each stream (stdout and stderr are sent apart, as by ipykernel)
        assert [x for x in log if not x.startswith("[stderr]")] == [f"r{r} before", f"r{r} after"]
        assert [x for x in log if x.startswith("[stderr]")] == [f"[stderr] r{r} bar 5000/5000"]


def test_a_rich_progress_bar_is_text_not_a_display_per_redraw(shell):
    # rich takes an engine for a notebook (Lightning's default bar where rich is installed): each redraw
    # was an HTML display from the rank, every one kept in the saved notebook
    cap = captured(shell, "-N 2 -n 2", """
        import time
        from rich.progress import track
        for i in track(range(20), description="work"):
            time.sleep(0.01)
        print("done")
        """)
    assert cap.outputs == []
    assert cap.stdout.count("done") == 4


class SmallLiveSink(LiveTextSink):
    KEEP_LINES_PER_RANK = 50


def test_output_past_the_limit_is_whole_in_the_logs(shell):
    runner = jupyter_dist.get_session().runner
    runner.sink_factory = SmallLiveSink  # the kernel's sink; its widget is a no-op here
    try:
        cap = captured(shell, "-N 2 -n 2 --ranks 0-1", """
            import os
            r = int(os.environ["RANK"])
            print("\\n".join(f"r{r} n{i}" for i in range(3000)))
            """)
    finally:
        runner.sink_factory = jupyter_dist.get_session().sink_factory
    logs = last_log_dir()
    out = cap.stdout
    assert f"showing rank 0, 1 of 4 (--ranks); every rank's output is in {logs}" in out
    assert f"[rank 0|node 0] ... 2950 earlier line(s) held back; all are in {logs / 'rank-0.log'}" in out
    assert "[rank 0|node 0] r0 n2999" in out and "r0 n100\n" not in out and "r2 n" not in out
    for r in range(4):
        assert (logs / f"rank-{r}.log").read_text().splitlines() == [f"r{r} n{i}" for i in range(3000)]


def test_report_leaves_a_chart_and_a_summary(shell):
    cap = captured(shell, "-N 2 -n 2", """
        import os, time, jupyter_dist
        r = int(os.environ["RANK"])
        for step in range(40):
            time.sleep(0.02 * (1 + (r == 3)))   # rank 3 is the straggler
            jupyter_dist.report(step=step, samples=32, loss=1.0 / (step + 1))
        """)
    charts = [o for o in cap.outputs if "image/png" in o.data]
    assert len(charts) == 1
    assert charts[0].data["text/plain"] == "<jupyter-dist chart: samples/s by rank and their sum; loss by step; 4 rank(s)>"
    out = cap.stdout
    assert "run summary: samples/s from report(), 4 rank(s)" in out
    for r in range(4):
        assert f"  rank {r}: " in out
    assert "slowest: rank 3 at" in out


def test_torch_optimizer_steps_without_report(shell):
    cap = captured(shell, "-f pytorch -N 2 -n 2", """
        import torch
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(30):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        """)
    assert any("image/png" in o.data for o in cap.outputs)
    assert "run summary: steps/s counted from optimizer steps, 4 rank(s)" in cap.stdout


@pytest.mark.timeout(300)
def test_scaling_draws_the_chart(shell):
    cap = captured(shell, "-N 2 -n 2 --scaling 1,2", """
        import time, jupyter_dist
        for step in range(20):
            time.sleep(0.02)
            jupyter_dist.report(step=step, samples=16)
        """)
    out = cap.stdout
    assert "--scaling: world size 1 (1 node(s) x 1)" in out and "--scaling: world size 2 (1 node(s) x 2)" in out
    charts = [o.data["text/plain"] for o in cap.outputs if "image/png" in o.data]
    assert charts == ["<jupyter-dist scaling chart: world sizes 1,2; samples/s>"]
    assert "scaling (samples/s, summed over ranks)" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("2 "))
    assert row.rstrip().endswith("%")  # the efficiency of world size 2
