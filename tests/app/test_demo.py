"""`ctlwire demo` end to end: real engine processes, real sockets."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from ctlwire.app import demo
from ctlwire.app.cli import main

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_demo_runs_and_every_invariant_holds(backend: str, tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    code = main(["demo", "--engines", "2", "--cycles", "4", "--backend", backend,
                 "--json", str(out)])
    data = json.loads(out.read_text())
    assert code == 0, data["problems"]
    assert data["problems"] == []
    assert data["latency_ms"]["update_weights"]["calls"] == 4
    assert data["fifo_checked"] > 0
    assert data["metrics"]["live_requests"] == 0


def test_demo_kill_one_surfaces_engine_dead_quickly() -> None:
    cfg = demo.DemoConfig(engines=3, cycles=6, kill_one=True)
    buf = io.StringIO()
    report = __import__("anyio").run(demo.run_demo, cfg, buf)
    assert report.killed_rank == 2
    assert report.detection_seconds is not None and report.detection_seconds < 3.0
    assert report.problems(cfg) == []
    assert report.final_versions[0] == report.final_versions[1] == 6
    # the cycle the kill broke failed on the dead rank only (typed: not delivered, or
    # outcome unknown), was retried without it, and the dead rank is out of routing
    dead_errors = {k for errs in report.errors.values() for k in errs}
    assert dead_errors and dead_errors <= {"NotDelivered", "OutcomeUnknown"}
    assert report.quarantined == [2]
    assert report.operations.get("committed") == 6
    text = demo.format_report(cfg, report)
    assert "EngineDead after" in text and "OK: every invariant holds" in text


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_demo_fault_update_compensates_the_fleet(backend: str) -> None:
    cfg = demo.DemoConfig(engines=3, cycles=4, fault="update", backend=backend)
    buf = io.StringIO()
    report = __import__("anyio").run(demo.run_demo, cfg, buf, backend=backend)
    assert report.problems(cfg) == []
    assert report.fault_verified and "rank 1 update_weights raises in cycle 2" in report.fault
    assert report.operations == {"aborted": 1, "committed": 3}
    assert report.errors["update_weights"] == {"InjectedFault": 1}
    assert report.final_versions == {0: 4, 1: 4, 2: 4}
    text = demo.format_report(cfg, report)
    assert "compensation verified" in text and "OK: every invariant holds" in text
    # the same report with the compensation unverified is a failure
    report.fault_verified = False
    assert any("not verified" in p for p in report.problems(cfg))


def test_demo_detects_a_broken_invariant() -> None:
    cfg = demo.DemoConfig(cycles=3)
    report = demo.DemoReport(metrics={"live_requests": 2}, fifo_checked=5,
                             final_versions={0: 3, 1: 2})
    problems = report.problems(cfg)
    assert any("left behind" in p for p in problems)
    assert any("versions" in p for p in problems)


def test_error_name_reads_the_type_inside_a_failed_undo() -> None:
    """A rank killed mid-operation can fail the undo of a step too; the demo
    counts the typed error inside, not the word 'failed'."""
    assert demo.error_name("NotDelivered: rank 2 lost") == "NotDelivered"
    assert demo.error_name("undo of 'pause' failed: OutcomeUnknown: rank 2 lost"
                           ) == "OutcomeUnknown"
    assert demo.error_name("") == "Unknown"


def test_progress_line_names_a_steps_ranks_in_words() -> None:
    line = demo.step_summary("pause", {0: "applying", 1: "applying", 2: "applying",
                                       3: "applied"})
    assert line == "step pause: 1 rank applied, 3 ranks applying"
    assert "x3" not in line and "applyingx" not in line


def test_summary_explains_the_errors_a_killed_rank_causes() -> None:
    """Errors next to "OK: every invariant holds" say why they are expected."""
    cfg = demo.DemoConfig(engines=3, cycles=2, kill_one=True, slow_update=0)
    report = demo.DemoReport(metrics={"live_requests": 0}, fifo_checked=5,
                             final_versions={0: 2, 1: 2, 2: 1}, killed_rank=2,
                             detection_seconds=0.3)
    report.errors["get_load"] = {"NotDelivered": 716, "OutcomeUnknown": 2}
    assert report.problems(cfg) == []
    text = demo.format_report(cfg, report)
    assert "NotDelivered 716" in text and "OK: every invariant holds" in text
    explained = text.split("expected errors", 1)[1].split("FIFO order")[0]
    assert "NotDelivered: a call to a rank already known lost is refused at once" in explained
    assert "never sent" in explained and "rank 2, killed on purpose by --kill-one" in explained
    assert "OutcomeUnknown: a call in flight when its rank died" in explained
    assert "(rank 2 was killed, so it stays behind)" in text
    assert max(len(line) for line in explained.splitlines()) <= 88


def test_summary_without_errors_explains_nothing() -> None:
    cfg = demo.DemoConfig(cycles=1, slow_update=0)
    report = demo.DemoReport(metrics={"live_requests": 0}, fifo_checked=5,
                             final_versions={0: 1})
    assert "expected errors" not in demo.format_report(cfg, report)
