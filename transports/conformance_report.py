"""What both sides of the conformance harness (:mod:`ctlwire.transports.conformance`)
share: the report of pass/fail checks, the codec, and the error a conformance
engine's ``fail`` method answers with."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from ctlwire.transports.codec import MsgpackCodec

__all__ = ["CODEC", "CONFORMANCE_ERROR", "Check", "Report"]

CODEC = MsgpackCodec()
#: what a conformance engine's ``fail`` method answers with
CONFORMANCE_ERROR = ("ConformanceError", 599)


@dataclass
class Check:
    """One check's outcome."""

    name: str
    passed: bool
    detail: str = ""

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.name}" + (
            f"  -- {self.detail}" if self.detail else "")


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, passed: bool, detail: str = "") -> bool:
        check = Check(name, passed, detail)
        self.checks.append(check)
        sys.stdout.write(check.line() + "\n")
        sys.stdout.flush()
        return passed

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)
