"""What both sides of the conformance harness (:mod:`ctlwire.conformance`)
share: the report of pass/fail checks, the codec, the error table, and the error a
conformance engine's ``fail`` method answers with."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from ctlwire.transports.codec import MsgpackCodec

__all__ = ["CODEC", "CONFORMANCE_ERROR", "ERROR_TABLE", "Check", "Report"]

CODEC = MsgpackCodec()
#: what a conformance engine's ``fail`` method answers with
CONFORMANCE_ERROR = ("ConformanceError", 599)
#: every row of the error table (``docs/protocol.md``, Error codes): its code, its type and
#: the class a client raises for it (the last row stands for a handler's own exception)
ERROR_TABLE: tuple[tuple[int, str, str], ...] = (
    (400, "MalformedFrame", "RemoteError"),
    (404, "UnknownMethod", "UnknownMethod"),
    (404, "UnknownStepMethod", "RemoteError"),
    (408, "DeadlineExpired", "RemoteError"),
    (403, "OperationOwned", "RemoteError"),
    (409, "Fenced", "Fenced"),
    (409, "StepInFlight", "RemoteError"),
    (410, "OperationAborted", "RemoteError"),
    (412, "StepNotApplied", "RemoteError"),
    (413, "OversizedFrame", "RemoteError"),
    (413, "ReplyTooLarge", "RemoteError"),
    (414, "KeyTooLong", "RemoteError"),
    (416, "FenceOutOfRange", "RemoteError"),
    (421, "WrongRank", "RemoteError"),
    (422, "InvalidPayload", "RemoteError"),
    (422, "InvalidStep", "RemoteError"),
    (425, "InProgress", "RemoteError"),
    (425, "StepOutOfOrder", "RemoteError"),
    (429, "Busy", "Busy"),
    (500, "ResultNotEncodable", "RemoteError"),
    (501, "AsyncHandlerInPoll", "RemoteError"),
    (505, "UnsupportedProtocolVersion", "UnsupportedProtocolVersion"),
    (507, "CacheFull", "RemoteError"),
    (507, "ResultNotRetained", "RemoteError"),
    (CONFORMANCE_ERROR[1], CONFORMANCE_ERROR[0], "RemoteError"),
)


@dataclass
class Check:
    """One check's outcome. ``skipped``: the rule it checks does not apply to this
    implementation (the spec gives it the choice, and it chose the other rule, which
    another check holds it to); a skipped check counts as passed."""

    name: str
    passed: bool
    detail: str = ""
    skipped: bool = False

    def line(self) -> str:
        word = "SKIP" if self.skipped else "PASS" if self.passed else "FAIL"
        return f"{word}  {self.name}" + (f"  -- {self.detail}" if self.detail else "")


@dataclass
class Report:
    """The checks made, in order; each printed as it is added."""

    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, passed: bool, detail: str = "") -> bool:
        return self._add(Check(name, passed, detail))

    def skip(self, name: str, why: str) -> None:
        """``name`` does not apply: ``why`` says which rule applies instead."""
        self._add(Check(name, True, why, skipped=True))

    def _add(self, check: Check) -> bool:
        self.checks.append(check)
        sys.stdout.write(check.line() + "\n")
        sys.stdout.flush()
        return check.passed

    def summary(self) -> str:
        """``N passed, S skipped, F failed``."""
        skipped = sum(c.skipped for c in self.checks)
        failed = sum(not c.passed for c in self.checks)
        return (f"{len(self.checks) - skipped - failed} passed, {skipped} skipped, "
                f"{failed} failed")

    def missing(self, names: tuple[str, ...]) -> None:
        """Fail every one of ``names`` no check reported (a case that never ran)."""
        done = {c.name for c in self.checks}
        for name in names:
            if name not in done:
                self.add(name, False, "not checked (an earlier step failed)")

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)
