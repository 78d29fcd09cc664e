"""The quick fault matrix and a load run, over real engine processes and ZeroMQ ipc.

Every scenario must lose nothing, leak nothing and see only the outcome types
its faults can cause; engine death and partition must be detected within the
liveness bound plus slack (3 s; the bound is about 1 s) and the rank must rejoin.
"""

from __future__ import annotations

import json

import pytest

from ctlwire.benchmarks.reliability import (
    ReliabilityReport,
    ScenarioRow,
    format_report,
    run_reliability,
    to_json,
)
from ctlwire.benchmarks.soak import DETECTION_BOUND, LoadConfig, run_load

pytestmark = pytest.mark.timeout(300)

SCENARIOS = ["baseline", "drop 1%", "duplicate 1%", "delay+reorder", "partition", "kill -9",
             "hostile", "soak"]


@pytest.fixture(scope="module")
def report() -> ReliabilityReport:
    return run_reliability(quick=True)


def row(report: ReliabilityReport, name: str) -> ScenarioRow:
    return next(r for r in report.rows if r.scenario == name)


def test_every_request_has_one_outcome_and_nothing_leaks(report: ReliabilityReport) -> None:
    table = format_report(report)
    assert [r.scenario for r in report.rows] == SCENARIOS, table
    for r in report.rows:
        assert r.sent >= 2_000, table
        assert r.lost == 0 and r.leaked == 0, table
        assert not r.unexpected, table
        assert sum(r.outcomes.values()) == r.sent, table
        assert r.outcomes["RemoteError"] >= r.sent // 200, table  # the fail() calls, typed
    assert report.problems() == [], table


def test_outcomes_match_the_faults(report: ReliabilityReport) -> None:
    table = format_report(report)
    base = row(report, "baseline")
    assert set(base.outcomes) == {"ok", "RemoteError"}, table
    drop = row(report, "drop 1%")
    assert drop.injected["drop"] > 0 and drop.outcomes.get("RequestTimedOut", 0) > 0, table
    dup = row(report, "duplicate 1%")
    assert dup.injected["duplicate"] > 0 and dup.duplicate > 0, table  # counted, not applied
    assert set(dup.outcomes) == {"ok", "RemoteError"}, table
    delay = row(report, "delay+reorder")
    assert delay.injected["delay"] > 0 and delay.injected["reorder"] > 0, table
    assert set(delay.outcomes) == {"ok", "RemoteError"}, table


def test_death_and_partition_detected_within_bound_then_rejoin(report: ReliabilityReport
                                                               ) -> None:
    table = format_report(report)
    for name in ("partition", "kill -9", "soak"):
        r = row(report, name)
        assert r.detection_s is not None and r.detection_s < DETECTION_BOUND, table
        assert r.rejoin_s is not None, table
        assert r.outcomes.get("EngineDead", 0) > 0, table  # pending calls failed, typed
    assert row(report, "partition").injected["partition"] > 0, table


def test_hostile_peers_get_nothing_accepted(report: ReliabilityReport) -> None:
    """Floods, spoofed identities, forged replies (unknown ids and ids of live
    requests) and a thawed old incarnation during traffic: no forged result
    accepted, nothing lost or leaked, no engine process crashed, the old
    incarnation never admitted again; everything hostile dropped and counted."""
    table = format_report(report)
    r = row(report, "hostile")
    assert r.forged_accepted == 0 and r.lost == 0 and r.leaked == 0, table
    assert r.crashed == 0 and r.readmitted == 0 and not r.unexpected, table
    assert all(r.injected.get(k, 0) > 0 for k in ("flood", "spoofed", "forged")), table
    assert r.dropped.get("dropped_unknown_peer", 0) > 0, table  # flood, non-canonical ids
    assert r.dropped.get("stray", 0) + r.dropped.get("unknown", 0) > 0, table  # forged
    assert r.dropped.get("foreign_rank", 0) > 0, table  # out-of-range ranks
    assert all(x.crashed == 0 for x in report.rows), table


def test_report_serializes(report: ReliabilityReport) -> None:
    data = json.loads(json.dumps(to_json(report)))
    assert data["lost"] == 0 and data["leaked"] == 0 and data["problems"] == []
    assert [r["scenario"] for r in data["rows"]] == SCENARIOS
    text = format_report(report)
    assert all(name in text for name in SCENARIOS) and "OK" in text


def test_load_thousands_in_flight_then_drained() -> None:
    load = run_load(cfg=LoadConfig(requests=2_000))
    assert load.max_live == 2_000 + load.gates, load
    assert load.outcomes == {"ok": 2_000 + load.gates}, load
    assert load.lost == 0 and load.leaked == 0 and load.live_after == 0, load
    assert load.problems() == []
