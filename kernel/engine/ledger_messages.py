"""What an operation ledger's built-in methods take and answer (``ctlwire.step``,
``ctlwire.take_over``, ``ctlwire.last_operation``); see
:mod:`~ctlwire.kernel.engine.operation_ledger`."""

from __future__ import annotations

import msgspec

__all__ = ["LastOperation", "StepRequest", "TakeOver"]


class StepRequest(msgspec.Struct, frozen=True):
    """One step (or compensation) of an operation, as sent to an engine.

    ``index``: the step's position in its plan; ``ranks``: every rank of the
    operation (recorded, so a successor knows whom the operation concerns)."""

    op: str
    step: str
    phase: str
    fence: int
    key: str
    method: str
    args: msgspec.Raw
    index: int = -1
    ranks: list[int] = msgspec.field(default_factory=list)


class TakeOver(msgspec.Struct, frozen=True):
    """A successor controller's fencing token (``ctlwire.take_over``)."""

    fence: int


class LastOperation(msgspec.Struct, frozen=True):
    """What a rank last applied: ``op`` is empty when it never applied a step.

    ``applied``: every step and compensation (``"step:undo"``) run here, in
    order; ``steps``: the forward steps applied (plan order); ``undone``: the
    steps whose compensation ran, in the order run; ``ranks``: the operation's
    ranks; ``fence``: the token the operation is bound to now."""

    rank: int
    op: str = ""
    step: str = ""
    phase: str = ""
    fence: int = 0
    applied: list[str] = msgspec.field(default_factory=list)
    highest_fence: int = 0
    steps: list[str] = msgspec.field(default_factory=list)
    undone: list[str] = msgspec.field(default_factory=list)
    ranks: list[int] = msgspec.field(default_factory=list)
