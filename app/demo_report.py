"""The configuration of ``ctlwire demo``, its report, the invariants it checks
(:meth:`DemoReport.problems`) and the summary it prints."""

from __future__ import annotations

import os
import platform
import textwrap
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DemoConfig", "DemoReport", "expected_error_notes", "format_report", "report_data"]


@dataclass
class DemoConfig:
    engines: int = 4
    cycles: int = 20
    transport: str = "ipc"
    connect: list[str] = field(default_factory=list)
    #: ``connect`` to tcp addresses without CURVE (the engines must allow it too)
    allow_insecure_tcp: bool = False
    #: ``connect`` to abstract ipc names (the engines must allow them too)
    allow_abstract_ipc: bool = False
    kill_one: bool = False
    backend: str = "asyncio"
    info_callers: int = 8
    load_callers: int = 4
    train_seconds: float = 0.1
    timeout: float = 5.0
    fault: str = ""  # "update": one rank's update_weights raises in the middle cycle
    slow_update: float = 2.0  # seconds the last cycle's update_weights blocks each engine
    ready_timeout: float = 30.0  # seconds to wait for every engine's first heartbeat


@dataclass
class DemoReport:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))
    fifo_checked: int = 0
    fifo_violations: list[str] = field(default_factory=list)
    cycle_failures: list[str] = field(default_factory=list)
    killed_rank: int | None = None
    detection_seconds: float | None = None
    final_versions: dict[int, int] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    wall_seconds: float = 0.0
    address: str = ""
    watch_joins: int = 0
    operations: dict[str, int] = field(default_factory=dict)
    aborted: list[str] = field(default_factory=list)
    fault: str = ""
    fault_verified: bool = False
    quarantined: list[int] = field(default_factory=list)
    slow_progress: dict[int, float] = field(default_factory=dict)  # rank -> highest fraction
    slow_busy: set[int] = field(default_factory=set)  # ranks seen Busy during the slow load
    slow_lost: int = 0  # ranks lost while the slow update ran

    def problems(self, cfg: DemoConfig) -> list[str]:
        out = list(self.cycle_failures) + list(self.fifo_violations)
        if self.metrics.get("live_requests", 1) != 0:
            out.append(f"{self.metrics.get('live_requests')} request-map entries left behind")
        if self.fifo_checked == 0:
            out.append("no get_server_info call completed: FIFO order not verified")
        expected = {"EngineDead", "NotDelivered", "OutcomeUnknown"}
        if cfg.fault:
            expected.add("InjectedFault")
        unexpected = {m: e for m, e in self.errors.items()
                      if any(k not in expected for k in e)}
        if unexpected:
            out.append(f"unexpected errors: {unexpected}")
        if cfg.kill_one:
            if self.detection_seconds is None:
                out.append("the killed engine was never detected")
            elif self.detection_seconds > 3.0:
                out.append(f"engine death took {self.detection_seconds:.2f} s to detect")
        if cfg.fault and not self.fault_verified:
            out.append(f"injected {cfg.fault} fault: compensation not verified ({self.fault})")
        stuck = [r for r in self.quarantined if r != self.killed_rank]
        if stuck:
            out.append(f"ranks {stuck} quarantined")
        if cfg.slow_update > 0 and cfg.cycles > 0:
            if self.slow_lost:
                out.append(f"{self.slow_lost} ranks declared lost while busy loading weights")
            live_ranks = [r for r in self.final_versions if r != self.killed_rank]
            unseen = [r for r in live_ranks if self.slow_progress.get(r, -1.0) <= 0]
            if unseen:
                out.append(f"no load progress seen from ranks {unseen}")
        live = [v for r, v in self.final_versions.items() if r != self.killed_rank]
        if any(v != cfg.cycles for v in live):
            out.append(f"final weight versions {self.final_versions}, expected {cfg.cycles}")
        return out


#: why an error the summary counts is expected, by its type name
_EXPECTED_ERRORS = {
    "NotDelivered": "a call to a rank already known lost is refused at once, never sent "
                    "(the work did not run; a retry is safe)",
    "OutcomeUnknown": "a call in flight when its rank died: it may have run (only an "
                      "idempotent call is retried)",
    "EngineDead": "a rank died while the call waited for it",
    "InjectedFault": "the update_weights failure injected by --fault update; the "
                     "operation undid every rank's change (compensated)",
}


def expected_error_notes(cfg: DemoConfig, report: DemoReport) -> list[str]:
    """One line per error type in the summary, saying why it is expected here."""
    seen = sorted({name for errs in report.errors.values() for name in errs})
    notes = []
    for name in seen:
        why = _EXPECTED_ERRORS.get(name)
        if why is None:
            continue
        if report.killed_rank is not None and name in ("NotDelivered", "OutcomeUnknown",
                                                       "EngineDead"):
            why += f"; here: rank {report.killed_rank}, killed on purpose by --kill-one"
        notes.extend(textwrap.wrap(f"{name}: {why}", width=88, initial_indent="    ",
                                   subsequent_indent="      "))
    return notes


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def format_report(cfg: DemoConfig, report: DemoReport) -> str:
    m = report.metrics
    reg = m.get("replies_dropped", {})
    lines = ["", "ctlwire demo — summary", ""]
    lines.append(f"  {'method':<18}{'calls':>8}{'p50 ms':>10}{'p99 ms':>10}  errors")
    for method in ("pause", "update_weights", "resume", "get_server_info", "get_load"):
        lat = report.latencies.get(method, [])
        errs = report.errors.get(method) or {}
        err_s = ", ".join(f"{k} {v}" for k, v in sorted(errs.items())) or "0"
        lines.append(f"  {method:<18}{len(lat):>8}{_pct(lat, 0.5) * 1e3:>10.2f}"
                     f"{_pct(lat, 0.99) * 1e3:>10.2f}  {err_s}")
    notes = expected_error_notes(cfg, report)
    if notes:
        lines.append("")
        lines.append("  expected errors (the demo injects these failures on purpose):")
        lines.extend(notes)
    lines.append("")
    fifo = ("verified" if not report.fifo_violations else "VIOLATED")
    lines.append(f"  FIFO order (get_server_info, queueing mailbox): {fifo} over "
                 f"{report.fifo_checked} rank-replies")
    lines.append(f"  watching mode (get_load): {report.watch_joins} callers shared an "
                 "in-flight request")
    lines.append(f"  replies dropped: late {reg.get('late', 0)}, duplicate "
                 f"{reg.get('duplicate', 0)}, unknown {reg.get('unknown', 0)}, stale incarnation "
                 f"{reg.get('stale_incarnation', 0)}")
    lines.append(f"  requests: {m.get('registered', 0)} registered, {m.get('cleaned', 0)} "
                 f"cleaned; live registry entries: {m.get('live_requests')} "
                 f"(tombstones {m.get('tombstones')})")
    killed = (f" (rank {report.killed_rank} was killed, so it stays behind)"
              if report.killed_rank is not None else "")
    lines.append(f"  weight versions at the end: {dict(sorted(report.final_versions.items()))}"
                 f"{killed}")
    ops = ", ".join(f"{n} {state}" for state, n in sorted(report.operations.items()))
    lines.append(f"  operations (pause -> update_weights -> resume): {ops or 'none'}")
    for summary in report.aborted:
        lines.append(f"    not committed: {summary}")
    if report.aborted and report.killed_rank is not None:
        lines.append(f"    (rank {report.killed_rank}'s death broke a cycle: it was undone and "
                     "retried on the live ranks)")
    if report.fault:
        verdict = "verified" if report.fault_verified else "NOT verified"
        lines.append(f"  injected fault: {report.fault}: compensation {verdict}")
    if report.quarantined:
        lines.append(f"  quarantined ranks (out of routing): {report.quarantined}")
    if cfg.slow_update > 0 and report.slow_progress:
        seen = " ".join(f"{r}:{f:.0%}" for r, f in sorted(report.slow_progress.items()))
        lines.append(f"  slow update_weights ({cfg.slow_update:g} s blocking each engine, on "
                     "purpose: the update_weights p99 above): "
                     f"progress seen live {seen}; busy ranks {sorted(report.slow_busy)}, "
                     f"lost {report.slow_lost}")
    if report.killed_rank is not None:
        det = (f"{report.detection_seconds:.2f} s" if report.detection_seconds is not None
               else "never")
        lines.append(f"  engine death: rank {report.killed_rank} killed with SIGKILL, "
                     f"EngineDead after {det}; the other ranks kept serving")
    diagrams = Path(__file__).resolve().parents[1] / "diagrams"
    where = diagrams if (diagrams / "README.md").exists() else "run 'ctlwire diagrams'"
    lines.append(f"  state diagrams: {where}")
    lines.append(f"  wall time {report.wall_seconds:.1f} s on {os.cpu_count()} cores, "
                 f"Python {platform.python_version()}, backend {cfg.backend}")
    problems = report.problems(cfg)
    lines.append("")
    lines.append("  OK: every invariant holds" if not problems
                 else "  FAILED:\n" + "\n".join(f"    - {p}" for p in problems))
    return "\n".join(lines) + "\n"


def report_data(cfg: DemoConfig, report: DemoReport) -> dict[str, Any]:
    """The summary as JSON-ready data (``ctlwire demo --json``)."""
    return {
        "latency_ms": {k: {"calls": len(v), "p50": _pct(v, 0.5) * 1e3,
                           "p99": _pct(v, 0.99) * 1e3} for k, v in report.latencies.items()},
        "errors": report.errors,
        "fifo_checked": report.fifo_checked,
        "problems": report.problems(cfg),
        "detection_seconds": report.detection_seconds,
        "metrics": report.metrics,
    }
