"""What an operation ledger refuses a step (or a take-over) with: each a
:class:`~ctlwire.kernel.core.inbound_core.Refused` with the protocol's ``code``,
so the reply is this error and nothing is recorded under the request's
idempotency key (:mod:`~ctlwire.kernel.engine.operation_ledger`)."""

from __future__ import annotations

from ctlwire.kernel.core.inbound_core import Refused
from ctlwire.transports.error_codes import ErrorCode

__all__ = ["Fenced", "InvalidStep", "OperationAborted", "OperationOwned", "StepInFlight",
           "StepNotApplied", "StepOutOfOrder", "UnknownStepMethod"]


class Fenced(Refused):
    """Engine side: a step of an older operation, refused (client: errors.Fenced)."""

    code = ErrorCode.FENCED


class UnknownStepMethod(Refused):
    """A step named a method the ledger was not given."""

    code = ErrorCode.UNKNOWN_STEP_METHOD


class OperationAborted(Refused):
    """A forward step of an operation whose compensation already ran here."""

    code = ErrorCode.OPERATION_ABORTED


class InvalidStep(Refused):
    """A malformed step: unknown phase, missing or implausible fence, wrong key or position."""

    code = ErrorCode.INVALID_STEP


class OperationOwned(Refused):
    """A step of an operation bound to another controller (same token, another peer)."""

    code = ErrorCode.OPERATION_OWNED


class StepOutOfOrder(Refused):
    """A forward step that is not the next one of its operation here."""

    code = ErrorCode.STEP_OUT_OF_ORDER


class StepInFlight(Refused):
    """A take-over while a step runs here: ask again once it returned."""

    code = ErrorCode.STEP_IN_FLIGHT


class StepNotApplied(Refused):
    """A compensation for a step this ledger did not apply: nothing to undo, nothing ran."""

    code = ErrorCode.STEP_NOT_APPLIED
