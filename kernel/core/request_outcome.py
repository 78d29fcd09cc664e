"""What a decided request's ranks say, in one word: the outcome metrics and spans report.

The request machine's terminal states say how a request was *decided* (``DONE``:
its policy was met, or every rank settled and at least one answered). The
outcome says what its ranks *answered*, and counts the present ranks a fan-out
without explicit ranks left out:

* ``DONE`` -- every rank that settled answered ok, and no rank was left out;
* ``PARTIAL`` -- the request was decided with at least one ok answer, and some
  rank answered with an error, failed locally (lost, not delivered) or was
  left out;
* ``FAILED`` -- no rank answered ok (every answer an error, or no answer at all);
* ``TIMED_OUT`` -- the deadline came first;
* ``CANCELLED`` -- the caller gave up first.

So a fan-out in which every rank's handler raised is ``FAILED``, a call whose
one rank raised is ``FAILED``, and a status fan-out that skipped a quarantined
rank is ``PARTIAL``.
"""

from __future__ import annotations

from ctlwire.kernel.core.request_registry import PendingRequest
from ctlwire.states import RequestState

__all__ = ["OUTCOMES", "request_outcome"]

OUTCOMES: tuple[str, ...] = ("DONE", "PARTIAL", "FAILED", "TIMED_OUT", "CANCELLED")
"""Every value :func:`request_outcome` returns."""


def request_outcome(entry: PendingRequest) -> str:
    """The outcome of ``entry`` once it reached a terminal state (see the module
    docstring); the state's name while it has not."""
    state = entry.state
    if state is not RequestState.DONE:
        return state.name
    if not entry.ok:
        return "FAILED"
    if entry.answered > entry.ok or entry.errors or entry.left_out:
        return "PARTIAL"
    return "DONE"
