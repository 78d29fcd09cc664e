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

from dataclasses import dataclass
from typing import Any

from ctlwire.kernel.core.fencing import new_fence

__all__ = ["OperationPlan", "OperationStep", "StepCall", "new_fence", "new_operation_id",
           "step_key"]


@dataclass(frozen=True)
class StepCall:
    """A method call on a rank: a compensating step. ``timeout`` None: the step's own."""

    method: str
    payload: Any = None
    timeout: float | None = None


@dataclass(frozen=True)
class OperationStep:
    """One step of an operation: a fan-out of ``method(payload)`` to every rank."""

    name: str
    method: str
    payload: Any = None
    timeout: float | None = None
    compensation: StepCall | None = None
    quarantine_on_error: bool = False


@dataclass(frozen=True)
class OperationPlan:
    """A named, non-empty sequence of steps with unique names."""

    name: str
    steps: tuple[OperationStep, ...]

    def __post_init__(self) -> None:
        if not self.steps:
            raise ValueError(f"operation {self.name!r} has no steps")
        names = [s.name for s in self.steps]
        if len(set(names)) != len(names):
            raise ValueError(f"operation {self.name!r}: step names must be unique: {names}")
        for name in names:
            if not name or ":" in name:
                raise ValueError(f"step name {name!r} must be non-empty and contain no ':'")

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
