"""The declaration of a coordinated multi-rank operation: its steps, their compensations.

::

    plan = OperationPlan("weight-sync", (
        OperationStep("pause", "pause", Pause(), timeout=5, compensation=StepCall("resume")),
        OperationStep("update", "update_weights", UpdateWeights(7), timeout=60,
                      compensation=StepCall("restore_weights", RestoreWeights(6))),
        OperationStep("resume", "resume", timeout=5),
    ))

Each step is one fan-out of ``method(payload)`` to every rank of the operation,
bounded by its own ``timeout``. A step's ``compensation`` undoes it on a rank
where it applied (or may have applied); ``None`` declares that the step changes
nothing that needs undoing. ``quarantine_on_error`` quarantines a rank whose
own step answered with an error instead of compensating it (for a step that can
leave a rank half-changed when it raises, e.g. a weight load).

Operation ids are minted here; fencing tokens by :func:`~ctlwire.kernel.core.fencing.new_fence`
(re-exported here), which is strictly
increasing within a process and time-based across processes (microseconds since
the epoch), so a controller that starts later holds a larger token than the one
it replaces, clocks permitting.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ctlwire.kernel.core.fencing import new_fence
from ctlwire.kernel.errors import InvalidPlan, PostConditionFailed

__all__ = ["InvalidPlan", "OperationPlan", "OperationStep", "PostCondition",
           "PostConditionFailed", "StepCall", "new_fence", "new_operation_id", "step_key"]


def _check_call(what: str, method: object, timeout: object) -> None:
    """A step's method is a non-empty str; its timeout None or a positive finite number."""
    problems = []
    if not isinstance(method, str) or not method:
        problems.append(f"{what}: method must be a non-empty str, not {method!r}")
    if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout) or timeout <= 0):
        problems.append(f"{what}: timeout must be a positive finite number of seconds "
                        f"(or None), not {timeout!r}")
    if problems:
        raise InvalidPlan(problems)


@dataclass(frozen=True)
class StepCall:
    """A method call on a rank: a compensating step. ``timeout`` None: the step's own.

    Raises :class:`InvalidPlan` for an empty method or a timeout that is not a
    positive finite number."""

    method: str
    payload: Any = None
    timeout: float | None = None

    def __post_init__(self) -> None:
        _check_call(f"compensation {self.method!r}", self.method, self.timeout)


@dataclass(frozen=True)
class OperationStep:
    """One step of an operation: a fan-out of ``method(payload)`` to every rank.

    Raises :class:`InvalidPlan` for an empty name or method, a timeout that is
    not a positive finite number (None: the client's default), or a
    compensation that is not a :class:`StepCall`."""

    name: str
    method: str
    payload: Any = None
    timeout: float | None = None
    compensation: StepCall | None = None
    quarantine_on_error: bool = False

    def __post_init__(self) -> None:
        _check_call(f"step {self.name!r}", self.method, self.timeout)
        if self.compensation is not None and not isinstance(self.compensation, StepCall):
            raise InvalidPlan([f"step {self.name!r}: compensation must be a StepCall, "
                               f"not {self.compensation!r}"])


@dataclass(frozen=True)
class PostCondition:
    """What must hold on every rank before an operation commits: the read-only
    ``method(payload)`` answers a mapping in which every key of ``expect`` has
    that value (e.g. ``PostCondition("get_server_info", {"version": 7,
    "paused": False})``)."""

    method: str
    expect: Mapping[str, Any]
    payload: Any = None
    timeout: float | None = None

    def __post_init__(self) -> None:
        _check_call(f"post-condition {self.method!r}", self.method, self.timeout)
        if not isinstance(self.expect, Mapping) or not self.expect:
            raise InvalidPlan([f"post-condition {self.method!r}: expect must be a non-empty "
                               "mapping"])

    def holds(self, answer: Any) -> bool:
        """Whether ``answer`` (the method's result) meets the post-condition."""
        return isinstance(answer, Mapping) and all(
            k in answer and answer[k] == v for k, v in self.expect.items())


@dataclass(frozen=True)
class OperationPlan:
    """A named, non-empty sequence of steps with unique names, and optionally the
    post-condition every rank must meet before the operation commits."""

    name: str
    steps: tuple[OperationStep, ...]
    postcondition: PostCondition | None = None

    def __post_init__(self) -> None:
        if not self.name or "@" in self.name:
            raise InvalidPlan([f"operation name {self.name!r} must be non-empty, without '@'"])
        if not self.steps:
            raise InvalidPlan([f"operation {self.name!r} has no steps"])
        if not all(isinstance(s, OperationStep) for s in self.steps):
            raise InvalidPlan([f"operation {self.name!r}: every step must be an OperationStep"])
        names = [s.name for s in self.steps]
        if len(set(names)) != len(names):
            raise InvalidPlan([f"operation {self.name!r}: step names must be unique: {names}"])
        for name in names:
            if not isinstance(name, str) or not name or ":" in name:
                raise InvalidPlan([f"step name {name!r} must be non-empty and contain no ':'"])

    def calls(self) -> list[tuple[str, str, Any, float | None]]:
        """Every call the plan can make: (what, method, payload, timeout), steps and
        compensations (a compensation's timeout defaults to its step's)."""
        out: list[tuple[str, str, Any, float | None]] = []
        for s in self.steps:
            out.append((f"step {s.name!r}", s.method, s.payload, s.timeout))
            c = s.compensation
            if c is not None:
                out.append((f"compensation of {s.name!r}", c.method, c.payload,
                            c.timeout if c.timeout is not None else s.timeout))
        return out

    def index(self, step: str) -> int:
        """The position of the step named ``step``; ValueError when there is none."""
        for i, s in enumerate(self.steps):
            if s.name == step:
                return i
        raise ValueError(f"operation {self.name!r} has no step {step!r}")


def new_operation_id(name: str, fence: int) -> str:
    """An operation id naming the plan and its fencing token (unique per token)."""
    return f"{name}@{fence:x}"


def step_key(op_id: str, step: str, undo: bool = False) -> str:
    """The idempotency key of a step (``undo``: of its compensation) in ``op_id``."""
    return f"{op_id}:{step}:undo" if undo else f"{op_id}:{step}"
