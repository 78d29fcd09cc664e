"""``ctlwire bench --quick`` runs end to end and writes a complete report.

These tests never assert speed: targets are reported (PASS/MISS), not enforced,
because the machines that run them are shared and noisy. They check that the
command works, that every row the bench promises is there with a numeric ratio
and a target, and that nothing is left behind (the session fixtures check for
child processes and ipc directories).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from ctlwire.app.cli import main
from ctlwire.benchmarks import (
    fanout_profile,
    idle_cpu,
    pipelined_fan_out,
    scale,
    stepping_engines,
    weight_sync,
)
from ctlwire.benchmarks.runner import GROUPS

#: groups run one at a time, each by a test of its own
ALONE = (*scale.GROUPS, *fanout_profile.GROUPS, *idle_cpu.GROUPS, *pipelined_fan_out.GROUPS)
#: the core groups, run together below
CORE_GROUPS = [g for g in GROUPS if g not in ALONE and g not in weight_sync.GROUPS]

#: (group, start of the scenario text) of every row the bench must report
EXPECTED_ROWS = [
    ("latency", "sequential call p50"),
    ("latency", "sequential call p99"),
    ("floor", "call p50 over libzmq floor"),
    ("throughput", "64 concurrent callers"),
    ("fanout", "queueing fan-out, 8 engines, 100 callers at once, asyncio"),
    ("fanout", "queueing fan-out, 8 engines, 500 callers at once, asyncio"),
    ("fanout", "queueing fan-out, 8 engines, 100 callers at once, trio"),
    ("fanout", "queueing fan-out, 8 engines, 500 callers at once, trio"),
    ("trio", "sequential call p50"),
    ("trio", "64 concurrent callers"),
    ("live", "call p50 with 10,000 live requests"),
    ("memory", "live registry entries"),
    ("memory", "tombstones vs their bound"),
    ("memory", "RSS growth"),
    ("state_table", "request lifecycle, 10 live requests"),
    ("engine_calls", "engine Python calls per plain request (one poll(), one request)"),
    ("engine_calls", "engine Python calls per plain request (one poll(), a burst of"),
    ("engine_calls", "idle poll() vs a bare non-blocking receive attempt"),
    ("cpu", "engine CPU per plain request, sequential calls, driven by ControlClient"),
    ("cpu", "engine CPU per plain request, 64 concurrent callers, driven by ControlClient"),
    ("cpu", "engine main thread CPU per plain request, sequential calls"),
    ("cpu", "client CPU per call, sequential calls (the same ControlClient on both sides)"),
]

#: the rows measured against a peer, each with its CPU rows beside it (the fan-out's
#: with the client and its engines together as well)
COMPARED = {
    ("latency", "sequential call p50, 1 engine"): ("sequential calls, 1 engine", "call"),
    ("throughput", "64 concurrent callers, 1 engine"): ("64 concurrent callers, 1 engine",
                                                        "call"),
    ("trio", "sequential call p50, 1 engine"): ("sequential calls, 1 engine", "call"),
    ("trio", "64 concurrent callers, 1 engine"): ("64 concurrent callers, 1 engine", "call"),
    **{("fanout", f"queueing fan-out, 8 engines, {n} callers at once, {backend}"):
       (f"queueing fan-out, 8 engines, {n} callers at once, {backend}", "fan-out")
       for n in (100, 500) for backend in ("asyncio", "trio")},
}
#: the groups whose every row is made of alternating runs of both sides
PAIRED_GROUPS = {"latency", "floor", "throughput", "fanout", "trio", "cpu"}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_row(row: dict[str, Any]) -> None:
    where = f"{row['group']}: {row['scenario']}"
    assert _number(row["ctlwire"]), where
    assert row["baseline"] is None or _number(row["baseline"]), where
    assert _number(row["ratio"]), where
    assert row["ratio_of"] and row["baseline_name"], where
    target = row["target"]
    assert target["op"] in ("<=", ">=", "info") and target["text"], where
    if target["op"] == "info":
        assert row["passed"] is None, where
    else:
        assert _number(target["value"]), where
        assert row["passed"] in (True, False), where  # reported, whichever it is


@pytest.mark.timeout(150)
def test_quick_bench_writes_every_row_with_ratio_and_target(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--json", str(out), "--only", *CORE_GROUPS]) == 0
    report = json.loads(out.read_text())

    assert report["quick"] is True
    assert report["groups"] == CORE_GROUPS
    for key in ("date", "cores", "python", "pyzmq", "libzmq"):
        assert report["machine"][key], key

    rows = report["rows"]
    assert {r["group"] for r in rows} == set(CORE_GROUPS)
    for group, scenario in EXPECTED_ROWS:
        assert any(r["group"] == group and r["scenario"].startswith(scenario) for r in rows), (
            f"missing row {group}: {scenario}")
    for row in rows:
        _check_row(row)
    # each comparison on trio is against the hand-written baseline on trio, not ctlwire
    for row in rows:
        if row["group"] == "trio" or row["scenario"].endswith(", trio"):
            assert row["baseline_name"].endswith("on trio"), row["scenario"]
            assert not row["baseline_name"].startswith("ctlwire"), row["scenario"]
    summary = report["summary"]
    assert summary["rows"] == len(rows)
    assert summary["pass"] + summary["miss"] + summary["info"] == len(rows)
    # the host's share of the CPU, for the run and each group that ran (Linux: measured)
    assert 0.0 <= report["steal_pct"] <= 100.0
    assert set(report["group_steal_pct"]) >= {"latency/floor/throughput", "fanout", "trio"}
    assert all(0.0 <= v <= 100.0 for v in report["group_steal_pct"].values())

    # beside every row measured against a peer: its CPU, client and engines, all threads
    by_key = {(r["group"], r["scenario"]): r for r in rows}
    for (group, scenario), (prefix, per) in COMPARED.items():
        assert (group, scenario) in by_key, scenario
        who = "8 engines" if per == "fan-out" else "1 engine"
        wanted = [f"{prefix}: client CPU per {per} (all threads)",
                  f"{prefix}: engine CPU per {per} ({who}, all threads)"]
        if per == "fan-out":
            wanted.append(f"{prefix}: total CPU per fan-out (client + 8 engines)")
        for cpu_scenario in wanted:
            row = by_key[(group, cpu_scenario)]
            assert row["ctlwire"] > 0 and row["baseline"] > 0, cpu_scenario
            assert row["unit"] == "µs", cpu_scenario
    # a fan-out's total is its client's and its engines' CPU
    prefix = "queueing fan-out, 8 engines, 100 callers at once, asyncio"
    total, client, engines = (by_key[("fanout", f"{prefix}: {what}")] for what in (
        "total CPU per fan-out (client + 8 engines)", "client CPU per fan-out (all threads)",
        "engine CPU per fan-out (8 engines, all threads)"))
    for side in ("ctlwire_runs", "baseline_runs"):
        for t, c, e in zip(total["details"][side], client["details"][side],
                           engines["details"][side], strict=True):
            assert t == pytest.approx(c + e, abs=0.02)
    # each of those rows: the medians of 2 alternating runs (--quick) and their ratios' spread
    for row in rows:
        if row["group"] not in PAIRED_GROUPS:
            continue
        details = row["details"]
        assert details["runs"] == 2, row["scenario"]
        assert len(details["ctlwire_runs"]) == len(details["baseline_runs"]) == 2
        low, high = row["spread"]
        assert low <= row["ratio"] <= high, row["scenario"]
        assert details["ratios"] == pytest.approx(
            [c / b for c, b in zip(details["ctlwire_runs"], details["baseline_runs"],
                                   strict=True)], rel=0.01, abs=0.002)

    # a correctness invariant, not a speed target: every call was cleaned up
    registry = next(r for r in rows if r["scenario"].startswith("live registry entries"))
    assert registry["ctlwire"] == 0

    table = capsys.readouterr().out
    assert "ctlwire bench --quick" in table and "cores" in table and "libzmq" in table
    assert "CPU stolen by the host (hypervisor) during the run: " in table
    for row in rows:
        assert row["scenario"] in table
        assert row["target"]["text"] in table


#: (group, start of the scenario text) of every row each load/scale group reports
SCALE_ROWS = {
    "scale": ["fan-out cost per rank, 8 ranks", "fan-out cost per rank, 64 ranks",
              "fan-out cost per rank, 256 ranks", "cost per rank at 256 vs 8 ranks",
              "fan-out cost per added rank, 64 -> 256 vs 8 -> 64",
              "client CPU per rank at 256 vs 8 ranks",
              "client RSS per rank, connected to 8 ranks",
              "client RSS per rank, connected to 256 ranks", "client RSS per added rank"],
    "multi_client": ["4 client processes, 8 engines that bind",
                     "calls not answered correctly"],
    "detect256": ["kill -9 of 1 rank among 256", "other ranks reported Lost"],
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("group", scale.GROUPS)
def test_quick_load_and_scale_group_reports_its_rows(tmp_path: Path, group: str) -> None:
    """Each load and scale group alone (``--quick``, its smallest run): its rows are there,
    every ratio finite, and the correctness rows hold. Timings are not judged."""
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--only", group, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["groups"] == [group]
    rows = report["rows"]
    assert {r["group"] for r in rows} == {group}
    for scenario in SCALE_ROWS[group]:
        assert any(r["scenario"].startswith(scenario) for r in rows), f"missing {scenario}"
    for row in rows:
        _check_row(row)
    if group == "multi_client":
        unanswered = next(r for r in rows if r["scenario"].startswith("calls not answered"))
        assert unanswered["ctlwire"] == 0 and unanswered["baseline"] > 0
    if group == "detect256":
        assert len(rows[0]["details"]["trials_s"]) == 1
        assert _number(rows[0]["details"]["trials_s"][0])  # the killed rank was seen Lost
        assert rows[1]["details"]["victim_lost_records"] >= 1  # and the client said so


def test_unknown_group_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--quick", "--only", "no_such_group"]) == 2
    assert "no_such_group" in capsys.readouterr().err


def test_weight_sync_rows_split_the_operation_and_judge_ctlwires_share() -> None:
    """The rows from measured syncs (the run itself is the torch demo's, tested there)."""
    from dataclasses import dataclass

    @dataclass
    class Timing:
        total: float
        data: float
        engine: float
        equal: bool = True

        @property
        def control(self) -> float:
            return self.total - self.data - self.engine

    timings = [Timing(1.0, 0.9, 0.09), Timing(1.2, 1.1, 0.09), Timing(1.0, 0.9, 0.05)]
    share, in_ms = weight_sync.timing_rows(timings, 57.0)
    assert share.ctlwire == pytest.approx(10.0) and share.baseline == pytest.approx(900.0)
    assert share.ratio == pytest.approx(1.0) and share.passed  # 10 ms of 1000 ms
    assert share.details["all_ranks_decode_like_trainer"]
    assert in_ms.ratio == pytest.approx(10.0) and in_ms.passed
    slow = weight_sync.timing_rows([Timing(0.2, 0.1, 0.05)], 57.0)
    assert not slow[0].passed and not slow[1].passed  # 50 ms: 25 % and over 20 ms


def _run_alone(tmp_path: Path, group: str) -> dict[str, Any]:
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--only", group, "--json", str(out)]) == 0
    report: dict[str, Any] = json.loads(out.read_text())
    assert report["groups"] == [group]
    assert {r["group"] for r in report["rows"]} == {group}
    for row in report["rows"]:
        _check_row(row)
    return report


@pytest.mark.timeout(180)
def test_fanout_pipeline_compares_busy_and_stepping_engines(tmp_path: Path) -> None:
    """Both rows on both backends, each with its CPU rows; in the stepping row every
    engine of both fleets has stepped (the steps each reports are in the details)."""
    report = _run_alone(tmp_path, "fanout_pipeline")
    rows = {r["scenario"]: r for r in report["rows"]}
    step_ms = f"{stepping_engines.STEP_SECONDS * 1e3:g}"
    for backend in ("asyncio", "trio"):
        for engines in ("engines", f"stepping engines ({step_ms} ms steps)"):
            scenario = f"pipelined fan-out (depth 4), 8 {engines}, 1,000 callers at once, {backend}"
            rate = rows[scenario]
            assert rate["unit"] == "fan-outs/s" and rate["target"]["value"] == 2.0
            assert len(rate["details"]["ratios"]) == 2  # --quick: 2 alternating runs
            for what in ("client CPU per fan-out", "engine CPU per fan-out (8 engines"):
                assert any(s.startswith(f"{scenario}: {what}") for s in rows), what
        stepping = rows[f"pipelined fan-out (depth 4), 8 stepping engines ({step_ms} ms "
                        f"steps), 1,000 callers at once, {backend}"]["details"]
        for side in ("ctlwire", "baseline"):
            steps = stepping[f"{side}_engine_steps"]
            assert len(steps) == 8 and all(n > 0 for n in steps), (side, steps)


@pytest.mark.timeout(180)
def test_fanout_profile_counts_both_sides_on_both_backends(tmp_path: Path) -> None:
    """Per rank per fan-out counts for client and engine, ctlwire and the baseline,
    on each backend; the notes name where each side's calls go."""
    report = _run_alone(tmp_path, "fanout_profile")
    rows = {r["scenario"]: r for r in report["rows"]}
    for backend in ("asyncio", "trio"):
        for what in ("client Python calls", "client C calls", "client task steps",
                     "client bytecodes", "engine Python calls", "engine C calls",
                     "engine bytecodes"):
            row = rows[f"{what} per rank per fan-out, 100 callers, {backend}"]
            assert row["ctlwire"] > 0 and row["baseline"] > 0, row["scenario"]
        calls = rows[f"client Python calls per rank per fan-out, 100 callers, {backend}"]
        assert calls["details"]["ctlwire_top_per_rank"]
        assert calls["details"]["baseline_top_per_rank"]
        for side in ("ctlwire", "baseline"):
            for where in ("client", "engine"):
                assert any(n.startswith(f"fanout_profile {backend} 100 callers {side} {where} ")
                           for n in report["notes"]), (backend, side, where)


@pytest.mark.timeout(400)
def test_idle_cpu_reports_cpu_and_detection_at_each_size(tmp_path: Path) -> None:
    """An idle client's CPU at 8, 64 and 256 ranks (a beacon per process), and at 256
    with a beacon per rank, each with its heartbeat rate and Python calls per
    heartbeat, and a frozen and a killed rank detected at each size (times are not
    judged). A process's ranks sharing a beacon send their heartbeats in one message
    a beat."""
    report = _run_alone(tmp_path, "idle_cpu")
    rows = {r["scenario"]: r for r in report["rows"]}
    for ranks, processes, beacons in ((8, 3, ""), (64, 3, ""), (256, 6, ""),
                                      (256, 6, ", a beacon per rank")):
        cpu = rows[f"idle client CPU, {ranks} ranks ({processes} processes{beacons})"]
        assert 0 < cpu["ctlwire"] < 100
        assert cpu["details"]["heartbeats_received_per_s"] > 0
        assert cpu["details"]["py_calls_per_heartbeat"] > 0
        for what in ("kill -9", "SIGSTOP"):
            row = rows[f"{what} of 1 rank among {ranks}{beacons}: time to Lost"]
            assert row["details"]["other_ranks_lost"] == 0
    shared, per_rank = (rows[f"idle client CPU, 256 ranks (6 processes{b})"]["details"]
                        for b in ("", ", a beacon per rank"))
    # 4 processes of 63-64 ranks and 2 of 1: 6 messages a beat for 256 heartbeats
    assert shared["heartbeats_per_message"] > 20
    assert per_rank["heartbeats_per_message"] < 1.5


@pytest.mark.parametrize("ranks, processes", [(8, 5), (64, 5), (256, 5), (1024, 17)])
def test_scale_hosts_at_most_64_ranks_a_process_and_the_last_rank_alone(
        ranks: int, processes: int) -> None:
    procs = scale.layout(ranks)
    assert len(procs) == processes
    assert sum(count for _, count in procs) == ranks
    assert [first for first, _ in procs] == sorted({first for first, _ in procs})
    assert max(count for _, count in procs) <= scale.RANKS_PER_PROCESS
    assert procs[-1] == (ranks - 1, 1)
    assert 1024 in scale.SCALE_RANKS and 1024 not in scale.SCALE_RANKS_QUICK
    assert (1024, True) in idle_cpu.POINTS and idle_cpu.CPU_TARGETS[1024] == 5.0
