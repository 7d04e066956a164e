"""metrics: report() batching on a rank, torch step counting, and the notebook-side aggregation."""

from __future__ import annotations

import json
import math

import pytest

from jupyter_dist.engine import cells, metrics_hooks
from jupyter_dist.engine import metrics as m
from jupyter_dist.run import metrics_store as ms


@pytest.fixture
def rank_side(monkeypatch):
    """Fresh rank-side state, a fake clock and a list that receives what would be sent."""
    clock = {"t": 1000.0}
    sent: list[dict] = []
    monkeypatch.setattr(m, "_now", lambda: clock["t"])
    monkeypatch.setattr(m, "_rows", [])
    monkeypatch.setattr(m, "_auto", [])
    monkeypatch.setattr(m, "_next_flush", 0.0)
    monkeypatch.setattr(m, "_reported", False)
    monkeypatch.setattr(m, "_state", {**m._state, "auto_opt": None, "sender": sent.append, "watching": True})
    return clock, sent


def test_report_batches_until_the_flush_interval(rank_side):
    clock, sent = rank_side
    for i in range(5):
        m.report(step=i, samples=32, loss=1.0 / (i + 1))
        clock["t"] += 0.1
    assert sent == []  # 0.4 s since the first record: nothing sent yet
    clock["t"] = 1000.0 + m.FLUSH_FIRST_S + 0.01
    m.report(step=5, samples=32, loss=0.1)
    assert len(sent) == 1
    batch = sent[0]
    assert batch["step"] == [0, 1, 2, 3, 4, 5] and batch["samples"] == [32] * 6
    assert batch["scalars"]["loss"][0] == 1.0 and len(batch["t"]) == 6
    assert "tokens" not in batch  # columns nobody used are left out
    json.dumps(batch)  # it travels as JSON


def test_the_gap_between_flushes_doubles_to_its_cap_and_starts_over_each_cell(rank_side):
    clock, sent = rank_side
    times = []
    for _ in range(2):  # two cells
        start, n = clock["t"], len(sent)
        while clock["t"] < start + 12:
            m.report(samples=1)
            if len(sent) > n:
                times.append(round(clock["t"] - start, 2))
                n = len(sent)
            clock["t"] += 0.01
        m.end_of_cell()
    first, second = times[:len(times) // 2], times[len(times) // 2:]
    assert first == second
    gaps = [b - a for a, b in zip([0.0, *first], first, strict=False)]
    assert [round(g, 1) for g in gaps[:3]] == [m.FLUSH_FIRST_S, 2 * m.FLUSH_FIRST_S, m.FLUSH_MAX_S]
    assert all(abs(g - m.FLUSH_MAX_S) < 0.02 for g in gaps[3:])


def test_end_of_cell_sends_the_rest_and_starts_afresh(rank_side):
    clock, sent = rank_side
    m.report(samples=8)
    m.report(samples=8, acc=0.5)
    key, payload = m.end_of_cell()
    assert key == m.KEY
    assert payload["samples"] == [8, 8] and payload["scalars"] == {"acc": [None, 0.5]}
    assert m.end_of_cell() is None  # nothing left
    assert m._next_flush == 0.0 and m._reported is False


def test_scalars_become_floats(rank_side):
    class Tensorish:
        def __float__(self):
            return 2.5

    m.report(loss=Tensorish(), n=3)
    _, payload = m.end_of_cell()
    assert payload["scalars"] == {"loss": [2.5], "n": [3.0]}
    with pytest.raises(TypeError, match="report\\(tag=...\\) needs a number"):
        m.report(tag="x")


def test_optimizer_steps_counted_without_report(rank_side):
    torch = pytest.importorskip("torch")
    clock, sent = rank_side
    assert m.hook_torch(load=True)
    try:
        _count_steps(torch, clock)
    finally:
        m._state["torch_hook"].remove()


def _count_steps(torch, clock):
    p = torch.nn.Parameter(torch.zeros(2))
    opt, other = torch.optim.SGD([p], lr=0.1), torch.optim.SGD([p], lr=0.1)
    for _ in range(4):
        p.grad = torch.ones(2)
        opt.step()
        other.step()  # a second optimizer is not counted twice
        clock["t"] += 0.01
    _, payload = m.end_of_cell()
    assert len(payload["auto_t"]) == 4 and "t" not in payload
    # a cell that calls report(): the steps are not counted
    opt.step()
    m.report(step=1)
    opt.step()
    _, payload = m.end_of_cell()
    assert "auto_t" not in payload and payload["step"] == [1]


def test_outside_jupyter_dist_report_is_a_no_op(monkeypatch, capsys):
    monkeypatch.delenv("JUPYTER_DIST_FRAMEWORK", raising=False)
    monkeypatch.setattr(m, "_state", {**m._state, "sender": None, "atexit": True})
    send = m._pick_sender()
    send({"v": 1})
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("JUPYTER_DIST_FRAMEWORK", "torchrun")  # a worker process of a run
    m._pick_sender()({"v": 1, "t": [1.0]})
    line = capsys.readouterr().out
    assert line.startswith(m.LINE_PREFIX)
    store = ms.MetricsStore(t0=0.0)
    assert store.add_line(3, line.rstrip("\n")) and store.ranks[3].t == [1.0]
    assert not store.add_line(3, "an ordinary line")


def store_of(rates: dict[int, float], n: int = 21, dt: float = 0.1, t0: float = 100.0, **extra) -> ms.MetricsStore:
    """Ranks reporting `samples` every `dt` s so that each runs at its given rate."""
    store = ms.MetricsStore(t0=t0)
    for rank, rate in rates.items():
        store.add(rank, {"t": [t0 + 1 + i * dt for i in range(n)], "samples": [rate * dt] * n,
                         "step": list(range(n)), "scalars": {"loss": [1.0 / (i + 1) for i in range(n)]}, **extra})
    return store


def test_mean_rates_and_straggler():
    store = store_of({0: 100.0, 1: 100.0, 2: 80.0, 3: 100.0})
    assert store.unit == "samples" and store.source == "report"
    rates = store.mean_rates()
    assert rates[2].rate == pytest.approx(80.0) and rates[0].rate == pytest.approx(100.0)
    assert store.total_rate() == pytest.approx(380.0)
    s = store.summary()
    assert s.slowest.rank == 2 and s.fastest.rank == 0
    assert s.behind_pct == pytest.approx(20.0)
    text = "\n".join(s.lines())
    assert "rank 3: 100.0 samples/s" in text
    assert "slowest: rank 2 at 80.0 samples/s, 20.0% behind the fastest (rank 0)" in text
    assert "loss (mean over ranks): first 1, last 0.04762" in text


def test_rate_series_is_flat_for_a_steady_rank():
    store = store_of({0: 50.0, 1: 150.0}, n=101)
    centres, by_rank, total = store.rate_series()
    assert len(centres) >= 10
    inner = [x for x in by_rank[1] if not math.isnan(x)]
    assert all(x == pytest.approx(150.0) for x in inner)
    assert all(x == pytest.approx(200.0) for x in total if not math.isnan(x))


def test_rate_series_starts_at_the_first_record_not_the_run_start():
    """torchrun's start-up (here 25 s before the first report) does not push the training to the right edge."""
    store = store_of({0: 100.0, 1: 100.0}, n=21, dt=0.01, t0=100.0)
    for series in store.ranks.values():
        series.t[:] = [t + 24.0 for t in series.t]  # first record at t0 + 25 s
    centres, by_rank, _ = store.rate_series()
    assert 0.0 < centres[0] < 0.01 and centres[-1] == pytest.approx(0.2, abs=0.01)
    assert by_rank[0][0] == pytest.approx(100.0)


def test_a_span_too_short_is_not_given_a_rate():
    store = store_of({0: 100.0, 1: 90.0}, n=2, dt=0.02)  # 2 steps, 20 ms apart
    text = store.summary().lines()
    assert text[0] == ("jupyter-dist: run summary: samples/s from report(), 2 rank(s), 0.0 s measured: "
                       f"too short to measure a rate (under {ms.MIN_MEASURED_S:g} s)")
    assert not any("samples/s" in line for line in text[1:])  # no rank, total or straggler rates
    assert text[1:] == ["  loss (mean over ranks): first 1, last 0.5"]  # the scalars still mean something
    enough = store_of({0: 100.0}, n=3, dt=0.6 * ms.MIN_MEASURED_S).summary().lines()
    assert "too short" not in enough[0] and enough[1] == "  rank 0: 100.0 samples/s"


def test_steps_from_step_deltas_and_auto():
    store = ms.MetricsStore(t0=0.0)
    store.add(0, {"t": [1.0, 2.0, 3.0], "step": [0, 10, 20]})  # reported every 10 steps
    assert store.unit == "steps"
    assert store.mean_rates()[0].rate == pytest.approx(10.0)
    auto = ms.MetricsStore(t0=0.0)
    auto.add(1, {"auto_t": [1.0, 1.5, 2.0, 2.5]})
    assert auto.source == "auto" and auto.unit == "steps"
    assert auto.mean_rates()[1].rate == pytest.approx(2.0)
    assert "counted from optimizer steps" in auto.summary().lines()[0]


def test_scalar_series_uses_steps_and_aligns_new_names():
    store = ms.MetricsStore(t0=0.0)
    store.add(0, {"t": [1.0, 2.0], "step": [5, 6], "scalars": {"loss": [0.5, 0.4]}})
    store.add(0, {"t": [3.0], "step": [7], "scalars": {"acc": [0.9]}})
    assert store.ranks[0].scalars == {"loss": [0.5, 0.4, None], "acc": [None, None, 0.9]}
    assert store.scalar_series("loss") == {0: ([5.0, 6.0], [0.5, 0.4])}
    assert store.scalar_series("acc") == {0: ([7.0], [0.9])}


def test_scaling_shape():
    assert ms.scaling_shape(4, 2) == (2, 2)
    assert ms.scaling_shape(1, 2) == (1, 1)
    assert ms.scaling_shape(3, 2) == (1, 3)


def test_scaling_from_metrics_and_from_wall_time():
    runs = [(ms.ScalingPoint(1, 1, 1, 0.0, 10.0), store_of({0: 100.0})),
            (ms.ScalingPoint(2, 1, 2, 0.0, 10.0), store_of({0: 90.0, 1: 90.0}))]
    res = ms.scaling_result(runs)
    assert res.unit == "samples/s"
    assert res.speedup(res.points[1]) == pytest.approx(1.8)
    assert res.efficiency(res.points[1]) == pytest.approx(0.9)
    assert "90%" in "\n".join(res.lines())
    wall = ms.scaling_result([(ms.ScalingPoint(1, 1, 1, 0.0, 100.0), None), (ms.ScalingPoint(4, 2, 2, 0.0, 25.0), None)])
    assert wall.unit == "runs/s"
    assert wall.speedup(wall.points[1]) == pytest.approx(4.0) and wall.efficiency(wall.points[1]) == pytest.approx(1.0)


def test_nice_width():
    assert ms.nice_width(0.13) == pytest.approx(0.2)
    assert ms.nice_width(3.0) == pytest.approx(5.0)
    assert ms.nice_width(7.0) == pytest.approx(10.0)


def test_a_large_batch_is_merged_with_exact_units(rank_side, monkeypatch):
    clock, sent = rank_side
    monkeypatch.setattr(m, "MAX_ROWS", 10)
    for i in range(95):
        clock["t"] += 0.001
        m.report(step=i, samples=2, loss=float(i % 2))
    _, payload = m.end_of_cell()
    assert len(payload["t"]) == 10 and sum(payload["samples"]) == 190
    assert payload["step"][0] == 9 and payload["step"][-1] == 94 and payload["t"][-1] == clock["t"]
    assert payload["scalars"]["loss"][0] == pytest.approx(0.5)


def test_copy_is_not_changed_by_later_batches():
    store = ms.MetricsStore(t0=0.0)
    store.add(0, {"t": [1.0, 2.0], "samples": [8, 8], "scalars": {"loss": [0.5, 0.4]}})
    snap = store.copy()
    store.add(0, {"t": [3.0], "samples": [8], "scalars": {"loss": [0.3], "acc": [0.9]}})
    assert snap.version == 1 and store.version == 2
    assert snap.ranks[0].t == [1.0, 2.0] and snap.ranks[0].scalars == {"loss": [0.5, 0.4]}
    assert snap.mean_rates()[0].rate == 8.0


def test_install_hooks_the_cells_once_and_before_cell_starts_afresh(rank_side, monkeypatch):
    monkeypatch.setattr(cells, "BEFORE_CELL", [])
    monkeypatch.setattr(cells, "END_OF_CELL", [])
    monkeypatch.setattr(metrics_hooks, "BEFORE_CELL", cells.BEFORE_CELL)
    monkeypatch.setattr(metrics_hooks, "END_OF_CELL", cells.END_OF_CELL)
    monkeypatch.setattr(m, "hook_torch", lambda load=False: False)
    metrics_hooks.install()
    metrics_hooks.install()
    assert [m.end_of_cell] == cells.END_OF_CELL and len(cells.BEFORE_CELL) == 1
    m.report(samples=1)
    assert m._reported
    cells.BEFORE_CELL[0]("x = 1")
    assert m._next_flush == 0.0 and m._reported is False


def test_text_progress_bars_replace_tqdm_auto(monkeypatch):
    pytest.importorskip("tqdm")
    import tqdm.auto
    import tqdm.autonotebook
    from tqdm import std

    for mod in (tqdm.auto, tqdm.autonotebook):  # put back after the test
        monkeypatch.setattr(mod, "tqdm", mod.tqdm)
        monkeypatch.setattr(mod, "trange", mod.trange)
    metrics_hooks.text_progress_bars()
    assert tqdm.auto.tqdm is std.tqdm and tqdm.auto.trange is std.trange
