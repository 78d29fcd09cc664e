"""The bench states how much CPU the host took (``steal``), per group and per run."""

from __future__ import annotations

import sys

import pytest

from ctlwire.benchmarks.cpu_steal import (
    CpuTimes,
    parse_proc_stat,
    read_cpu_times,
    steal_percent,
)
from ctlwire.benchmarks.report import NOISY_STEAL_PCT, Report
from ctlwire.benchmarks.series import Series

#: /proc/stat of a 2-core guest (trimmed): user nice system idle iowait irq softirq steal
#: guest guest_nice
PROC_STAT = """cpu  67059 0 9116 176869 152 0 406 759 11 0
cpu0 33000 0 4500 88000 70 0 200 380 5 0
cpu1 34059 0 4616 88869 82 0 206 379 6 0
intr 123456 0 9 0
ctxt 987654
"""


def test_parse_reads_the_all_cores_line_and_leaves_guest_time_out_of_the_total() -> None:
    times = parse_proc_stat(PROC_STAT)
    assert times == CpuTimes(total=67059 + 9116 + 176869 + 152 + 406 + 759, steal=759)


@pytest.mark.parametrize("text", ["", "cpu0 1 2 3 4 5 6 7 8\n", "cpu  1 2 3 4\n",
                                  "cpu  1 2 x 4 5 6 7 8\n"])
def test_parse_without_an_all_cores_line_with_steal_is_none(text: str) -> None:
    assert parse_proc_stat(text) is None


def test_steal_percent_is_the_share_of_the_cpu_time_that_passed() -> None:
    before = CpuTimes(total=10_000, steal=100)
    assert steal_percent(before, CpuTimes(total=12_000, steal=600)) == 25.0
    assert steal_percent(before, CpuTimes(total=12_000, steal=100)) == 0.0
    assert steal_percent(before, CpuTimes(total=10_000, steal=100)) is None  # no time
    assert steal_percent(None, before) is None and steal_percent(before, None) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_this_machine_reports_counters_that_only_grow() -> None:
    first = read_cpu_times()
    assert first is not None and 0 <= first.steal <= first.total
    sum(range(200_000))  # let some CPU time pass
    second = read_cpu_times()
    assert second is not None and second.total >= first.total and second.steal >= first.steal


def test_the_table_states_the_steal_and_flags_a_run_that_was_not_quiet() -> None:
    quiet = Report(quick=True, machine=_machine(), steal_pct=0.8,
                   group_steal_pct={"latency": 0.5, "trio": 1.25})
    line = quiet.steal_text()
    assert line == ("CPU stolen by the host (hypervisor) during the run: 0.8 % "
                    "(by group: latency 0.5 %, trio 1.2 %)")
    assert line in quiet.table()
    assert quiet.to_json()["group_steal_pct"] == {"latency": 0.5, "trio": 1.25}

    noisy = Report(quick=True, machine=_machine(), steal_pct=NOISY_STEAL_PCT + 20)
    assert "not quiet" in noisy.steal_text() and "25.0 %" in noisy.steal_text()
    unknown = Report(quick=True, machine=_machine())
    assert "not measured" in unknown.steal_text()
    assert unknown.to_json()["steal_pct"] is None


def test_the_series_shows_each_runs_steal() -> None:
    series = Series()
    for steal in (0.4, 31.0, None):
        series.add(Report(quick=True, machine=_machine(), steal_pct=steal))
    assert "CPU stolen by the host during each run: 0.4% 31.0% -" in series.table()


def _machine() -> dict[str, object]:
    return {"date": "2026-12-02", "cores": 2, "platform": "Linux", "python": "3.11",
            "pyzmq": "27", "libzmq": "4.3.5", "anyio": "4", "trio": "0.35",
            "msgspec": "0.23", "loadavg_at_start": [0.1, 0.1, 0.1]}
