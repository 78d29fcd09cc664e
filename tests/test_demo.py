"""`ctlwire demo` end to end: real engine processes, real sockets."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from ctlwire.kernel import demo
from ctlwire.kernel.cli import main

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
    dead = ("EngineDead", "NotDelivered", "OutcomeUnknown")  # EngineDead and its refinements
    assert sum(report.errors["update_weights"].get(name, 0) for name in dead) >= 1
    text = demo.format_report(cfg, report)
    assert "EngineDead after" in text and "OK: every invariant holds" in text


def test_demo_detects_a_broken_invariant() -> None:
    cfg = demo.DemoConfig(cycles=3)
    report = demo.DemoReport(metrics={"live_requests": 2}, fifo_checked=5,
                             final_versions={0: 3, 1: 2})
    problems = report.problems(cfg)
    assert any("left behind" in p for p in problems)
    assert any("versions" in p for p in problems)
