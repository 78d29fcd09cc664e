"""``ctlwire bench --runs N``: every run kept, each row judged on its median."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctlwire.app.cli import main
from ctlwire.benchmarks.report import Report, Row, Target
from ctlwire.benchmarks.series import Series

LE_1 = Target("<=", 1.0, "<= 1.0x")
GE_1 = Target(">=", 1.0, ">= 1.0x")


def _report(load: float, **ratios: float) -> Report:
    report = Report(quick=True, machine={"loadavg_at_start": [load, 0.0, 0.0]})
    for name, ratio in ratios.items():
        target = LE_1 if name.startswith("latency") else GE_1
        report.rows.append(Row(name.split("_")[0], name, "x", ratio, 1.0, "base", ratio,
                               "ctlwire / base", target))
    report.rows.append(Row("scale", "info row", "KiB", 61.0, None, "-", 61.0, "-",
                           Target("info")))
    return report


def test_series_judges_each_row_on_its_median_and_counts_runs_that_passed() -> None:
    series = Series()
    series.add(_report(0.3, latency_seq=0.95, fanout_q=1.05))
    series.add(_report(2.5, latency_seq=1.04, fanout_q=0.97))
    series.add(_report(1.1, latency_seq=0.97, fanout_q=0.99))
    rows = {s.scenario: s for s in series.rows}
    seq, fan = rows["latency_seq"], rows["fanout_q"]
    assert seq.ratios == [0.95, 1.04, 0.97] and seq.median == 0.97
    assert seq.median_passed is True and seq.passes == 2
    assert fan.median == 0.99 and fan.median_passed is False and fan.passes == 1
    assert rows["info row"].median_passed is None
    assert series.runs_passing_every_row == 1  # only the first passed both rows
    table = series.table()
    assert "load at each start (1 min): 0.30 2.50 1.10" in table
    assert "0.95 1.04* 0.97" in table and "1.05 0.97* 0.99*" in table
    assert "1 of 3 runs passed every row; 1 rows miss their target on the median" in table
    assert "MISS on the median: fanout / fanout_q: 0.99x, target >= 1.0x" in table
    assert "info row" not in table


def test_series_shows_a_run_that_missed_by_less_than_two_decimals() -> None:
    series = Series()
    series.add(_report(0.2, fanout_q=0.9996))
    series.add(_report(0.2, fanout_q=1.09))
    (fan,) = [s for s in series.rows if s.scenario == "fanout_q"]
    assert fan.run_texts() == ["0.9996*", "1.09"]
    assert "0.9996* 1.09" in series.table()


def test_series_keeps_a_row_that_only_some_runs_reported() -> None:
    series = Series()
    series.add(_report(0.1, latency_seq=0.9))
    series.add(_report(0.1, latency_seq=0.8, fanout_q=1.2))
    rows = {s.scenario: s for s in series.rows}
    assert rows["fanout_q"].ratios == [1.2] and rows["fanout_q"].passes == 1
    assert rows["latency_seq"].median == pytest.approx(0.85)


@pytest.mark.timeout(120)
def test_bench_runs_twice_and_writes_both_runs_and_the_medians(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "series.json"
    assert main(["bench", "--quick", "--only", "state_table", "--runs", "2",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "=== run 1 of 2" in printed and "=== run 2 of 2" in printed
    assert "ctlwire bench, 2 runs" in printed
    data = json.loads(out.read_text())
    assert len(data["runs"]) == 2
    rows = {r["scenario"]: r for r in data["rows"]}
    lifecycle = rows["request lifecycle, 10 live requests"]
    assert len(lifecycle["ratios"]) == 2
    assert lifecycle["median"] == pytest.approx(sorted(lifecycle["ratios"])[0] / 2
                                                + sorted(lifecycle["ratios"])[1] / 2)
    assert lifecycle["passes"] == sum(1 for p in lifecycle["passed"] if p)


def test_bench_runs_below_one_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--quick", "--only", "state_table", "--runs", "0"])
    assert exit_info.value.code == 2
    assert "argument --runs: must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["--reliability", "--soak"])
def test_bench_runs_with_reliability_or_soak_is_a_usage_error(
        mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--quick", mode, "--runs", "3"]) == 2
    assert "--runs repeats the ratio bench" in capsys.readouterr().err
