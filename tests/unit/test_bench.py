"""The bench's pure parts (engine.probes, tools.bench_report): bandwidth arithmetic, the nccl-tests style table, HTML and the chart."""

from __future__ import annotations

import pytest

from jupyter_dist.engine.probes import DEFAULT_SIZES, bus_factor
from jupyter_dist.tools.bench_report import chart_png, format_bytes, format_table, to_html

ROWS = [
    {
        "size_bytes": 8,
        "count": 2,
        "dtype": "float32",
        "time_us": 25.0,
        "algbw_GBps": 0.00032,
        "busbw_GBps": 0.00048,
        "wrong": 0,
    },
    {
        "size_bytes": 64 << 20,
        "count": 16 << 20,
        "dtype": "float32",
        "time_us": 200_000.0,
        "algbw_GBps": (64 << 20) / 0.2 / 1e9,
        "busbw_GBps": (64 << 20) / 0.2 / 1e9 * 1.5,
        "wrong": 0,
    },
]


def test_bus_factor_matches_nccl_tests():
    assert bus_factor(1) == 0.0
    assert bus_factor(2) == 1.0
    assert bus_factor(4) == 1.5
    assert bus_factor(8) == 1.75


def test_default_sizes_span_8_bytes_to_64_mib():
    assert DEFAULT_SIZES[0] == 8 and DEFAULT_SIZES[-1] == 64 << 20
    assert list(DEFAULT_SIZES) == sorted(set(DEFAULT_SIZES))
    assert len(DEFAULT_SIZES) <= 16  # keeps a CPU run short


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (8, "8 B"),
        (1024, "1 KiB"),
        (2048, "2 KiB"),
        (512 << 10, "512 KiB"),
        (64 << 20, "64 MiB"),
        (3 << 30, "3 GiB"),
    ],
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text


def test_format_table_nccl_tests_style():
    text = format_table(ROWS, 4, "gloo")
    lines = text.splitlines()
    assert lines[0] == "# all_reduce, 4 ranks, backend gloo"
    header = lines[2].split()
    assert header == ["#", "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong"]
    assert lines[3].split() == ["#", "(B)", "(elements)", "(us)", "(GB/s)", "(GB/s)"]
    first = lines[4].split()
    assert first == ["8", "2", "float", "sum", "25.0", "0.00", "0.00", "0"]
    last = lines[5].split()
    assert last[0] == str(64 << 20) and last[4] == "200000.0" and last[5] == "0.34" and last[6] == "0.50"
    assert "# Out of bounds values : 0 OK" in text
    assert lines[-1].startswith("# Avg bus bandwidth    : 0.25")
    assert all(line == line.rstrip() for line in lines)


def test_format_table_reports_wrong_values():
    bad = [dict(ROWS[0], wrong=3)]
    assert "# Out of bounds values : 3 FAILED" in format_table(bad, 1, "nccl")
    assert format_table(bad, 1, "nccl").startswith("# all_reduce, 1 rank, backend nccl")


def test_to_html():
    out = to_html(ROWS, 2, "<gloo>")
    assert out.startswith('<table class="jupyter-dist-bench">')
    assert "backend &lt;gloo&gt;" in out
    assert out.count("<tr>") == 2 + len(ROWS)  # header, rows, footer
    assert "64 MiB" in out and "8 B" in out


def test_chart_png_is_a_png():
    png = chart_png(ROWS, 1.25)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    assert chart_png(ROWS, None, title="x")[:4] == b"\x89PNG"
    assert chart_png([], None)[:4] == b"\x89PNG"
