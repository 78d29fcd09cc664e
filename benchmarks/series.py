"""Several whole bench runs and what they say together: ``ctlwire bench --runs N``.

One run's ratio moves by ±5-10 % on a shared machine (where the scheduler puts a
round trip's threads decides more than either stack's CPU), so
a row whose target sits inside that spread passes in some runs and not in others.
:class:`Series` keeps every run's report and, per row, every run's ratio, their
median judged against the row's target, and in how many runs the row passed, next
to how many runs passed every row: one lucky or unlucky run is then visible as such.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .report import Report, Target, format_ratio, verdict

__all__ = ["Series", "SeriesRow"]


@dataclass
class SeriesRow:
    """One scenario across the runs that reported it (in run order)."""

    group: str
    scenario: str
    target: Target
    ratio_unit: str
    ratios: list[float] = field(default_factory=list)
    passed: list[bool | None] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    @property
    def median_passed(self) -> bool | None:
        """The row's target judged on the median of its runs' ratios."""
        return self.target.met(self.median)

    @property
    def passes(self) -> int:
        return sum(1 for p in self.passed if p)

    def median_text(self) -> str:
        return format_ratio(self.median, self.target) + self.ratio_unit

    def run_texts(self) -> list[str]:
        """Each run's ratio as the one-run table prints it, ``*`` where that run
        missed the target."""
        return [format_ratio(x, self.target) + ("*" if p is False else "")
                for x, p in zip(self.ratios, self.passed, strict=True)]

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "scenario": self.scenario,
                "target": {**asdict(self.target), "text": self.target.describe()},
                "ratios": self.ratios, "passed": self.passed, "median": self.median,
                "median_passed": self.median_passed, "passes": self.passes}


@dataclass
class Series:
    """The reports of several runs of the same groups, in the order they ran."""

    reports: list[Report] = field(default_factory=list)

    def add(self, report: Report) -> None:
        self.reports.append(report)

    @property
    def rows(self) -> list[SeriesRow]:
        """One entry per (group, scenario), in first-seen order."""
        by_key: dict[tuple[str, str], SeriesRow] = {}
        for report in self.reports:
            for row in report.rows:
                key = (row.group, row.scenario)
                entry = by_key.get(key)
                if entry is None:
                    entry = by_key[key] = SeriesRow(row.group, row.scenario, row.target,
                                                    row.ratio_unit)
                entry.ratios.append(row.ratio)
                entry.passed.append(row.passed)
        return list(by_key.values())

    @property
    def runs_passing_every_row(self) -> int:
        return sum(1 for r in self.reports if not r.misses)

    def table(self) -> str:
        """Every judged row: each run's ratio (``*`` where it missed), the median and
        its verdict, and the runs it passed in."""
        n = len(self.reports)
        loads = [r.machine.get("loadavg_at_start") for r in self.reports]
        out = [f"ctlwire bench, {n} runs; load at each start (1 min): "
               + " ".join("-" if load is None else f"{load[0]:.2f}" for load in loads)
               + "; CPU stolen by the host during each run: "
               + " ".join("-" if r.steal_pct is None else f"{r.steal_pct:.1f}%"
                          for r in self.reports), ""]
        body = []
        for s in self.rows:
            if s.target.op == "info":
                continue
            runs = " ".join(s.run_texts())
            body.append((s.group, s.scenario, runs, s.median_text(), s.target.describe(),
                         verdict(s.median_passed), f"{s.passes}/{len(s.ratios)}"))
        cols = ("group", "scenario", "ratio per run (* missed)", "median", "target",
                "median", "runs passed")
        widths = [max(len(c), *(len(b[i]) for b in body)) if body else len(c)
                  for i, c in enumerate(cols)]
        out.append("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
        out.append("  ".join("-" * w for w in widths))
        out += ["  ".join(v.ljust(w) for v, w in zip(b, widths, strict=True)) for b in body]
        misses = [s for s in self.rows if s.median_passed is False]
        out.append("")
        out.append(f"{self.runs_passing_every_row} of {n} runs passed every row; "
                   f"{len(misses)} rows miss their target on the median")
        out += [f"  MISS on the median: {s.group} / {s.scenario}: {s.median_text()}, "
                f"target {s.target.describe()}" for s in misses]
        return "\n".join(out)

    def to_json(self) -> dict[str, Any]:
        return {"tool": "ctlwire bench --runs", "runs": [r.to_json() for r in self.reports],
                "rows": [s.to_json() for s in self.rows],
                "runs_passing_every_row": self.runs_passing_every_row}

    def write_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n")
