"""What an operation ledger refuses a step (or a take-over) with: each a
:class:`~ctlwire.kernel.core.inbound_core.Refused` with the protocol's ``code``,
so the reply is this error and nothing is recorded under the request's
idempotency key (:mod:`~ctlwire.kernel.engine.operation_ledger`)."""

from __future__ import annotations

from ctlwire.kernel.core.inbound_core import Refused
from ctlwire.kernel.errors import FENCED_CODE

__all__ = ["Fenced", "InvalidStep", "OperationAborted", "OperationOwned", "StepInFlight",
           "StepNotApplied", "StepOutOfOrder", "UnknownStepMethod"]


class Fenced(Refused):
    """Engine side: a step of an older operation, refused (client: errors.Fenced)."""

    code = FENCED_CODE


class UnknownStepMethod(Refused):
    """A step named a method the ledger was not given."""

    code = 404


class OperationAborted(Refused):
    """A forward step of an operation whose compensation already ran here."""

    code = 410


class InvalidStep(Refused):
    """A malformed step: unknown phase, missing or implausible fence, wrong key or position."""

    code = 422


class OperationOwned(Refused):
    """A step of an operation bound to another controller (same token, another peer)."""

    code = 403


class StepOutOfOrder(Refused):
    """A forward step that is not the next one of its operation here."""

    code = 425


class StepInFlight(Refused):
    """A take-over while a step runs here: ask again once it returned."""

    code = 409


class StepNotApplied(Refused):
    """A compensation for a step this ledger did not apply: nothing to undo, nothing ran."""

    code = 412
