"""What an operation ledger's built-in methods take and answer (``ctlwire.step``,
``ctlwire.take_over``, ``ctlwire.last_operation``); see
:mod:`~ctlwire.kernel.engine.operation_ledger`."""

from __future__ import annotations

from typing import Annotated

import msgspec

__all__ = ["MAX_STEP_RANKS", "LastOperation", "Name", "StepRequest", "TakeOver"]

#: a step names at most this many ranks (an operation's whole fleet)
MAX_STEP_RANKS = 65_536
#: an operation id, a step, a phase, a key or a method: at most 1,024 characters
Name = Annotated[str, msgspec.Meta(max_length=1024)]


class StepRequest(msgspec.Struct, frozen=True):
    """One step (or compensation) of an operation, as sent to an engine.

    ``index``: the step's position in its plan; ``ranks``: every rank of the
    operation (recorded, so a successor knows whom the operation concerns)."""

    op: Name
    step: Name
    phase: Name
    fence: int
    key: Name
    method: Name
    args: msgspec.Raw  # decoded as the step method's own payload type
    index: int = -1
    ranks: Annotated[list[int], msgspec.Meta(max_length=MAX_STEP_RANKS)] = msgspec.field(
        default_factory=list)


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
