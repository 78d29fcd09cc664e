"""Aborting a running operation step: ``ctlwire.abort_step`` and :func:`step_aborted`.

::

    def update_weights(req: Update) -> dict:        # an operation step
        for chunk in chunks:
            while not received(chunk, wait=0.1):    # a collective, waited in slices
                if step_aborted():                  # its controller gave up on it
                    raise TransferAborted("aborted by the operation's controller")

A controller that learns a rank of a running step was lost (a collective's
peer died) asks the other ranks to abort that step: ``ctlwire.abort_step``
(:class:`AbortStep`: operation id, step, phase, fencing token). The
:class:`~ctlwire.kernel.engine.operation_ledger.OperationLedger` serves it apart
from the steps (``threaded``, like ``ctlwire.take_over``), so it is answered
while the step blocks its own thread. Guarantees:

* **Only the step's own controller.** The abort must come from the peer that
  sent the running step (its connection, or the key its transport names for
  it) with the step's own fencing token (:class:`OperationOwned` otherwise), and
  a token older than the highest this rank accepted is :class:`Fenced`.
* **Exact.** It names the operation, the step and the phase (``apply`` or
  ``compensate``): an abort late for a step never touches the next one. Its
  answer is True when that step is running here and now sees
  :func:`step_aborted`, False (nothing changed) when it is not running (not
  started yet, or already ended).
* **Cooperative.** Nothing is interrupted: the step's handler reads
  :func:`step_aborted` where it can stop safely and raises; the step then fails
  like any step that raised (not recorded; the controller compensates). A
  handler that never reads it runs to its end.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Hashable
from dataclasses import dataclass, field

import msgspec

from ctlwire.kernel.engine.ledger_messages import Name

__all__ = ["ABORT_STEP_METHOD", "AbortStep", "RunningStep", "step_aborted"]

ABORT_STEP_METHOD = "ctlwire.abort_step"


class AbortStep(msgspec.Struct, frozen=True):
    """Abort step ``step`` (phase ``phase``) of operation ``op``, under ``fence``."""

    op: Name
    step: Name
    phase: Name
    fence: int


@dataclass
class RunningStep:
    """The step a ledger runs now: what it is, whose it is, whether it was aborted."""

    op: str
    step: str
    phase: str
    fence: int
    owner: Hashable
    aborted: threading.Event = field(default_factory=threading.Event)

    def matches(self, req: AbortStep) -> bool:
        return (self.op, self.step, self.phase) == (req.op, req.step, req.phase)


_current_step: contextvars.ContextVar[RunningStep | None] = contextvars.ContextVar(
    "ctlwire_current_step", default=None)


def step_aborted() -> bool:
    """Whether the controller of the operation step the calling handler runs asked
    to abort it (``ctlwire.abort_step``). Callable from sync, threaded and async
    step handlers, from any thread; False outside a step."""
    running = _current_step.get()
    return running is not None and running.aborted.is_set()


def enter_step(running: RunningStep) -> contextvars.Token[RunningStep | None]:
    """Make ``running`` the step the calling handler runs (the ledger, around it)."""
    return _current_step.set(running)


def leave_step(token: contextvars.Token[RunningStep | None]) -> None:
    _current_step.reset(token)
