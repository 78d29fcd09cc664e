"""The bench's table says which side of its target a ratio fell on."""

from __future__ import annotations

import pytest

from ctlwire.benchmarks.report import Report, Row, Target


def _row(ratio: float, target: Target) -> Row:
    return Row("latency", "sequential call p50, 1 engine", "µs", 220.9, 220.0,
               "raw pyzmq", ratio, "ctlwire / baseline", target)


@pytest.mark.parametrize(("ratio", "target", "shown"), [
    (1.004, Target("<=", 1.0, "<= 1.0x"), "1.004x"),   # a MISS that two decimals hide
    (0.996, Target("<=", 1.0, "<= 1.0x"), "0.996x"),   # a PASS that reads as the bound
    (0.946, Target(">=", 0.95, ">= 0.95x"), "0.946x"),
    (0.97, Target("<=", 1.0, "<= 1.0x"), "0.97x"),
    (0.9996, Target(">=", 1.0, ">= 1.0x"), "0.9996x"),  # three decimals still hide it
    (1.2, Target("<=", 1.2, "<= 1.2x"), "1.20x"),      # exactly on the bound: met as shown
    (0.0, Target("<=", 0.0, "== 0"), "0.00x"),
    (1.0, Target("info"), "1.00x"),
])
def test_ratio_text_shows_three_decimals_only_when_two_read_as_the_target(
        ratio: float, target: Target, shown: str) -> None:
    assert _row(ratio, target).ratio_text() == shown


def test_table_and_miss_line_show_the_ratio_that_missed() -> None:
    report = Report(quick=True)
    report.rows.append(_row(220.9 / 220.0, Target("<=", 1.0, "<= 1.0x")))
    table = report.table()
    assert "1.004x" in table
    assert "MISS latency / sequential call p50, 1 engine: ratio 1.004x, target <= 1.0x" in table
