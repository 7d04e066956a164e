"""The live chart's SVG (views/svg_chart.py): well-formed, the same panels as the matplotlib chart, bounded."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest

from jupyter_dist.run.metrics_store import MetricsStore
from jupyter_dist.views import svg_chart
from jupyter_dist.views.svg_chart import MAX_POINTS, downsample, metrics_svg, nice_ticks, tick_labels

SVG = "{http://www.w3.org/2000/svg}"


def store(ranks: int = 4, n: int = 300, scalars: tuple[str, ...] = ("loss",)) -> MetricsStore:
    s = MetricsStore(t0=0.0)
    for r in range(ranks):
        s.add(r, {"t": [1.0 + 0.01 * i for i in range(n)], "step": list(range(n)), "samples": [8 + r] * n,
                  "scalars": {name: [1.0 / (i + 1) + k for i in range(n)] for k, name in enumerate(scalars)}})
    return s


def panels(svg: str) -> list[ET.Element]:
    return ET.fromstring(svg).findall(SVG + "g[@class='panel']")


def texts(el: ET.Element) -> list[str]:
    return [t.text or "" for t in el.iter(SVG + "text")]


def lines(el: ET.Element) -> list[ET.Element]:
    return list(el.iter(SVG + "polyline"))


def test_rates_panel_has_a_line_per_rank_and_the_sum():
    svg = metrics_svg(store(ranks=4, scalars=()))
    root = ET.fromstring(svg)
    assert root.tag == SVG + "svg"
    (rates,) = panels(svg)
    drawn = lines(rates)
    assert len(drawn) == 5
    assert [p.get("stroke") for p in drawn[:4]] == list(svg_chart.TAB10[:4])
    assert drawn[4].get("stroke") == "#000000" and drawn[4].get("stroke-width") == "2"
    words = texts(rates)
    assert words[0] == "samples/s"
    assert "seconds since the first report()" in words
    assert [w for w in words if w.startswith("rank ") or w == "sum"] == ["rank 0", "rank 1", "rank 2", "rank 3", "sum"]
    ys = [float(v.split(",")[1]) for v in drawn[4].get("points").split()]
    assert max(ys) < float(root.get("height"))  # inside the picture


def test_optimizer_steps_title_and_one_rank_has_no_sum():
    s = MetricsStore(t0=0.0)
    s.add(0, {"auto_t": [1.0 + 0.05 * i for i in range(40)]})
    (rates,) = panels(metrics_svg(s))
    assert texts(rates)[0] == "steps/s (optimizer steps)"
    assert "seconds since the first optimizer step" in texts(rates)
    assert len(lines(rates)) == 1 and "sum" not in texts(rates)


def test_a_panel_per_scalar_at_most_three_two_a_row():
    s = store(ranks=2, scalars=("loss", "lr", "acc", "grad_norm"))
    svg = metrics_svg(s)
    found = panels(svg)
    assert [texts(p)[0] for p in found] == ["samples/s", *s.scalar_names()[:3]]  # as charts.metrics_figure
    for p in found[1:]:
        assert len(lines(p)) == 2 and "step" in texts(p) and "rank 1" in texts(p)
    root = ET.fromstring(svg)
    assert (root.get("width"), root.get("height")) == ("680", "440")


def test_no_legend_past_eight_ranks_but_the_sum():
    found = panels(metrics_svg(store(ranks=9, n=50)))
    assert not any(w.startswith("rank ") for p in found for w in texts(p))
    assert "sum" in texts(found[0])
    assert len(lines(found[0])) == 10


def test_text_is_escaped():
    svg = metrics_svg(store(ranks=1, scalars=("<b>&",)))
    assert "<b>&" not in svg and "&lt;b&gt;&amp;" in svg
    assert texts(panels(svg)[1])[0] == "<b>&"  # parsed back as written


def test_nothing_to_draw_and_not_enough_points():
    assert metrics_svg(MetricsStore(t0=0.0)) is None
    s = MetricsStore(t0=0.0)
    s.add(0, {"t": [1.0], "samples": [4]})
    assert metrics_svg(s) is None  # one record: no rate and no scalar, as the matplotlib chart
    s.add(0, {"t": [1.0], "samples": [4], "scalars": {"loss": [2.0]}})
    rates, loss = panels(metrics_svg(s))
    assert "not enough points yet" in texts(rates) and not lines(rates)
    assert texts(loss)[0] == "loss"


def test_gaps_break_the_line():
    s = svg_chart.Series([0.0, 1.0, 2.0, 3.0, 4.0], [1.0, 2.0, math.nan, 3.0, 4.0], "#123456")
    box = svg_chart.Box(0, 0, 100, 100, 0.0, 4.0, 0.0, 4.0)
    drawn = svg_chart.polylines(s, *svg_chart.pixels(s, box))
    assert len(drawn) == 2
    assert 'points="0.0,75.0 25.0,50.0"' in drawn[0] and 'points="75.0,25.0 100.0,0.0"' in drawn[1]


def test_long_series_are_cut_to_the_bound_and_keep_the_extremes():
    n = 100_000
    xs = [float(i) for i in range(n)]
    ys = [math.sin(i / 500) for i in range(n)]
    ys[54_321] = 9.0  # a spike
    x, y = downsample(xs, ys)
    assert len(x) <= MAX_POINTS and len(x) >= MAX_POINTS - 10
    assert x[0] == 0.0 and x[-1] == n - 1 and list(x) == sorted(x)
    assert 9.0 in y and min(y) == min(ys)
    short_x, short_y = downsample([1.0, 2.0], [3.0, 4.0])
    assert list(short_x) == [1.0, 2.0] and list(short_y) == [3.0, 4.0]
    svg = metrics_svg(store(ranks=2, n=5000))
    assert all(len(p.get("points").split()) <= MAX_POINTS for p in ET.fromstring(svg).iter(SVG + "polyline"))


@pytest.mark.parametrize(("lo", "hi", "ticks"), [
    (0.0, 10.0, [0.0, 2.5, 5.0, 7.5, 10.0]),
    (0.0, 1.0, [0.0, 0.25, 0.5, 0.75, 1.0]),
    (0.0, 7.3, [0.0, 2.0, 4.0, 6.0]),
    (3.21, 3.79, [3.3, 3.4, 3.5, 3.6, 3.7]),
    (-1.0, 1.0, [-1.0, -0.5, 0.0, 0.5, 1.0]),
    (0.0, 23_456.0, [0.0, 5000.0, 10_000.0, 15_000.0, 20_000.0]),
    (5.0, 5.0, [5.0]),
    (0.0, math.nan, []),
])
def test_nice_ticks(lo, hi, ticks):
    assert nice_ticks(lo, hi) == pytest.approx(ticks)


def test_tick_labels():
    assert tick_labels([0.0, 2.5, 5.0]) == ["0.0", "2.5", "5.0"]
    assert tick_labels([0.0, 5000.0, 10_000.0, 15_000.0]) == ["0", "5k", "10k", "15k"]
    assert tick_labels([0.0, 2000.0, 4000.0, 6000.0, 8000.0]) == ["0", "2000", "4000", "6000", "8000"]
    assert tick_labels([0.0, 0.001, 0.002]) == ["0.000", "0.001", "0.002"]
    assert tick_labels([-0.5, 0.0, 0.5]) == ["-0.5", "0.0", "0.5"]
    assert tick_labels([0.0, 2_000_000.0, 4_000_000.0, 6_000_000.0]) == ["0", "2M", "4M", "6M"]
