"""Each rank's typed outcome of one operation dispatch (a ``concurrent`` fan-out).

A result is OK; ``Fenced`` is FENCED; ``NotDelivered`` or a request the client
refused before sending is NOT_DELIVERED (did not run); ``StepNotApplied`` for a
compensation is NOT_APPLIED; any other remote error is ERROR (did not apply);
``EngineDead``, a timeout or a missing outcome is UNKNOWN (may have run).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.core.fan_out_result import FanOutResult
from ctlwire.kernel.core.operation_core import StepOutcome
from ctlwire.kernel.errors import (
    FanOutFailed,
    Fenced,
    NotDelivered,
    OutcomeUnknown,
    RemoteError,
    RequestTimedOut,
)

__all__ = ["Outcome", "answers", "classify", "outcomes", "refused"]

Outcome = tuple[StepOutcome, str, "Exception | None"]  # the outcome, its detail, its error
OK: Outcome = (StepOutcome.OK, "", None)


def classify(error: Exception | None) -> tuple[StepOutcome, str]:
    """A rank's outcome of a dispatch from its fan-out error (None: it answered ok)."""
    if error is None:
        return StepOutcome.OK, ""
    # a remote error reads as the engine's exception: "InjectedFault: ... (code 500 ...)"
    detail = str(error) if isinstance(error, RemoteError) else f"{type(error).__name__}: {error}"
    if isinstance(error, Fenced):
        return StepOutcome.FENCED, detail
    if isinstance(error, NotDelivered):
        return StepOutcome.NOT_DELIVERED, detail
    if isinstance(error, RemoteError):
        if error.type_name == "StepNotApplied":  # a compensation with nothing to undo there
            return StepOutcome.NOT_APPLIED, detail
        return StepOutcome.ERROR, detail
    return StepOutcome.UNKNOWN, detail  # EngineDead, timeouts, anything else: may have run


async def answers(client: ControlClient, method: str, payload: Any = None, *,
                  ranks: Sequence[int], timeout: float | None, **options: Any
                  ) -> FanOutResult | None:
    """The result of a ``concurrent`` fan-out, a failed or timed-out one's partial
    result included; None when nothing came back."""
    try:
        return await client.fan_out(method, payload, ranks=ranks, timeout=timeout,
                                    mode="concurrent", **options)
    except FanOutFailed as exc:
        return exc.result
    except RequestTimedOut as exc:
        return exc.partial


def outcomes(res: FanOutResult | None, ranks: Sequence[int], missing: str,
             judge: Callable[[int, Any], Outcome] = lambda rank, answer: OK
             ) -> dict[int, Outcome]:
    """Each rank's outcome: ``judge`` of its answer, :func:`classify` of its error,
    UNKNOWN (``missing``) when it has neither."""
    found: dict[int, Outcome] = {}
    for rank in ranks:
        if res is not None and rank in res.results:
            found[rank] = judge(rank, res.results[rank])
        elif res is not None and rank in res.errors:
            error = res.errors[rank]
            found[rank] = (*classify(error), error)
        else:
            found[rank] = (StepOutcome.UNKNOWN, missing, OutcomeUnknown(rank, missing))
    return found


def refused(ranks: Sequence[int], exc: Exception) -> dict[int, Outcome]:
    """Every rank NOT_DELIVERED: the client refused the request before any frame
    went out (encoding, size, timeout), a failure of the step that ends in compensation."""
    detail = f"{type(exc).__name__}: {exc}"
    return {rank: (StepOutcome.NOT_DELIVERED, detail, exc) for rank in ranks}
