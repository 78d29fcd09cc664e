"""Rows, targets, the terminal table and the JSON of ``ctlwire bench``.

Every row compares ctlwire to something measured in the same run and carries
its ratio, the target that ratio must meet and whether it met it. Targets are
reported, never enforced: the bench exits 0 whether or not a row misses.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

__all__ = ["Report", "Row", "Target", "format_ratio", "machine_info", "verdict"]

Op = Literal["<=", ">=", "info"]

#: steal (percent of the run's CPU time) from which a run is flagged as not quiet
#: (:mod:`ctlwire.benchmarks.cpu_steal`)
NOISY_STEAL_PCT = 5.0


@dataclass(frozen=True)
class Target:
    """``ratio op value``; ``op="info"`` for rows shown for context only."""

    op: Op
    value: float = 0.0
    text: str = ""

    def met(self, ratio: float) -> bool | None:
        if self.op == "<=":
            return ratio <= self.value
        if self.op == ">=":
            return ratio >= self.value
        return None

    def describe(self) -> str:
        if self.text:
            return self.text
        if self.op == "info":
            return "info"
        return f"{self.op} {self.value:g}"


def format_ratio(ratio: float, target: Target) -> str:
    """``ratio`` with two decimals, or as many more (up to four) as it takes not to
    read as ``target``'s own value when it is not (``1.00`` for a MISS of
    ``<= 1.0x`` says nothing)."""
    text = f"{ratio:.2f}"
    if target.op != "info" and ratio != target.value:
        for digits in (3, 4):
            if float(text) != target.value:
                break
            text = f"{ratio:.{digits}f}"
    return text


@dataclass
class Row:
    """One line of the table.

    ``ctlwire`` and ``baseline`` are the two measured values (in ``unit``),
    ``ratio`` is what the target judges (its definition in ``ratio_of``). A row
    measured over several alternating runs has the median of the runs' values and of
    their ratios there, and the lowest and highest of those ratios in ``spread``.
    """

    group: str
    scenario: str
    unit: str
    ctlwire: float
    baseline: float | None
    baseline_name: str
    ratio: float
    ratio_of: str
    target: Target
    details: dict[str, Any] = field(default_factory=dict)
    ratio_unit: str = "x"
    spread: tuple[float, float] | None = None

    @property
    def passed(self) -> bool | None:
        return self.target.met(self.ratio)

    def ratio_text(self) -> str:
        """The ratio as the table prints it (:func:`format_ratio`), with its unit."""
        return format_ratio(self.ratio, self.target) + self.ratio_unit

    def spread_text(self) -> str:
        """The runs' lowest and highest ratio (``-`` for a row measured once)."""
        if self.spread is None:
            return "-"
        low, high = self.spread
        return f"{format_ratio(low, self.target)}-{format_ratio(high, self.target)}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["target"] = {**asdict(self.target), "text": self.target.describe()}
        data["passed"] = self.passed
        return data


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def machine_info() -> dict[str, Any]:
    """Date, cores, Python and library versions, and the load when the bench began."""
    import zmq

    try:
        load: list[float] | None = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on Linux/macOS
        load = None
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
        "anyio": _version("anyio"),
        "trio": _version("trio"),
        "msgspec": _version("msgspec"),
        "ctlwire": _version("ctlwire"),
        "loadavg_at_start": load,
    }


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit in ("µs", "ms", "MB"):
        return f"{value:,.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"
    if unit in ("calls/s", "fan-outs/s"):
        return f"{value:,.0f}/s"
    if float(value).is_integer():
        return f"{int(value):,} {unit}".rstrip()
    return f"{value:,.2f} {unit}".rstrip()


def verdict(passed: bool | None) -> str:
    """PASS, MISS, or - for a row judged by no target."""
    return "-" if passed is None else ("PASS" if passed else "MISS")


@dataclass
class Report:
    """The rows of one bench run, plus where and when it ran."""

    quick: bool
    machine: dict[str, Any] = field(default_factory=machine_info)
    rows: list[Row] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    #: CPU time the hypervisor took during the whole run, in percent
    #: (:mod:`ctlwire.benchmarks.cpu_steal`; None where it cannot be read)
    steal_pct: float | None = None
    #: the same during each group's measurement, by group (in the order they ran)
    group_steal_pct: dict[str, float | None] = field(default_factory=dict)

    def add(self, rows: Sequence[Row]) -> None:
        self.rows.extend(rows)

    @property
    def misses(self) -> list[Row]:
        return [r for r in self.rows if r.passed is False]

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": "ctlwire bench",
            "quick": self.quick,
            "machine": self.machine,
            "groups": self.groups,
            "elapsed_s": round(self.elapsed_s, 2),
            "steal_pct": _rounded(self.steal_pct),
            "group_steal_pct": {g: _rounded(v) for g, v in self.group_steal_pct.items()},
            "rows": [r.to_json() for r in self.rows],
            "summary": {
                "rows": len(self.rows),
                "pass": sum(1 for r in self.rows if r.passed is True),
                "miss": len(self.misses),
                "info": sum(1 for r in self.rows if r.passed is None),
            },
            "notes": self.notes,
        }

    def write_json(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n")

    def table(self) -> str:
        """The terminal table: one line per row, then a legend."""
        m = self.machine
        head = [
            f"ctlwire bench{' --quick' if self.quick else ''} - {m['date']}",
            f"machine: {m['cores']} cores, {m['platform']}; Python {m['python']}; "
            f"pyzmq {m['pyzmq']} / libzmq {m['libzmq']}; anyio {m['anyio']}, "
            f"trio {m['trio']}, msgspec {m['msgspec']}; load at start {m['loadavg_at_start']}",
            "transport ipc, codec msgpack (msgspec) on both sides; baselines measured in "
            "this run, alternating with ctlwire; a row with runs' ratios shows the medians "
            "of alternating runs and the lowest-highest of the runs' ratios; CPU is on-CPU "
            "time of every thread of every process involved (/proc/<pid>/task/*/schedstat)",
            self.steal_text(),
            "",
        ]
        cols = ("group", "scenario", "ctlwire", "baseline", "ratio", "runs' ratios", "target",
                "result")
        body = [
            (r.group, r.scenario, _fmt(r.ctlwire, r.unit), _fmt(r.baseline, r.unit),
             r.ratio_text(), r.spread_text(), r.target.describe(), verdict(r.passed))
            for r in self.rows
        ]
        widths = [max(len(c), *(len(b[i]) for b in body)) if body else len(c)
                  for i, c in enumerate(cols)]
        line = "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))
        out = [*head, line, "  ".join("-" * w for w in widths)]
        out += ["  ".join(v.ljust(w) for v, w in zip(b, widths, strict=True)) for b in body]
        out.append("")
        seen: set[str] = set()
        for r in self.rows:
            key = f"{r.group}/{r.baseline_name}/{r.ratio_of}"
            if key in seen:
                continue
            seen.add(key)
            out.append(f"  {r.group}: baseline = {r.baseline_name}; ratio = {r.ratio_of}")
        summary = self.to_json()["summary"]
        out.append("")
        out.append(f"{summary['pass']} PASS, {summary['miss']} MISS, {summary['info']} info "
                   f"rows; {self.elapsed_s:.1f} s")
        for row in self.misses:
            out.append(f"  MISS {row.group} / {row.scenario}: ratio "
                       f"{row.ratio_text()}, target {row.target.describe()}")
        out.extend(f"note: {n}" for n in self.notes)
        return "\n".join(out)

    def steal_text(self) -> str:
        """The line that says how much CPU the host took, during the run and each group."""
        if self.steal_pct is None:
            return "CPU stolen by the host (hypervisor): not measured on this machine"
        groups = ", ".join(f"{g} {_pct(v)}" for g, v in self.group_steal_pct.items())
        text = f"CPU stolen by the host (hypervisor) during the run: {_pct(self.steal_pct)}"
        if groups:
            text += f" (by group: {groups})"
        if self.steal_pct >= NOISY_STEAL_PCT:
            text += (f"; at {NOISY_STEAL_PCT:g} % or more the machine was not quiet: "
                     "read the ratios as such")
        return text


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} %"


def print_table(report: Report) -> None:
    print(report.table(), file=sys.stdout, flush=True)
