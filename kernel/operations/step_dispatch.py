"""One operation step sent to its ranks; a rank lost meanwhile makes the others abort it.

::

    res = await step_answers(client, dispatch, StepRequest(...))   # FanOutResult | None

:func:`step_answers` is :func:`~ctlwire.kernel.operations.step_outcomes.answers` for a
``ctlwire.step`` dispatch, with one addition: once a rank of the dispatch is lost
or restarted (its own part then ends at once, ``OutcomeUnknown``), the other
ranks are asked to abort the step (``ctlwire.abort_step`` under the dispatch's
operation, step, phase and fence; see :mod:`~ctlwire.kernel.engine.step_abort`),
again every heartbeat interval until each says it did or refuses, and only
while the dispatch runs. A step blocked in a collective with the lost rank then
fails as soon as its handler reads ``step_aborted()``.
"""

from __future__ import annotations

from typing import Any

import anyio

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.core.fan_out_result import FanOutResult
from ctlwire.kernel.core.operation_core import Dispatch
from ctlwire.kernel.engine.ledger_messages import StepRequest
from ctlwire.kernel.engine.operation_ledger import STEP_METHOD
from ctlwire.kernel.engine.step_abort import ABORT_STEP_METHOD, AbortStep
from ctlwire.kernel.errors import Busy, NotDelivered, RemoteError
from ctlwire.kernel.operations.step_outcomes import answers

__all__ = ["abort_on_loss", "retry_safe", "step_answers"]


async def step_answers(client: ControlClient, d: Dispatch, payload: StepRequest,
                       **options: Any) -> FanOutResult | None:
    """``payload`` (the step of ``d``) sent to ``d.ranks`` as a ``concurrent`` fan-out,
    the other ranks asked to abort it once one is lost; its (partial) result. Raises
    what :func:`answers` raises, as it raises it (not in an exception group)."""
    if len(d.ranks) == 1:
        return await answers(client, STEP_METHOD, payload, ranks=d.ranks, timeout=d.timeout,
                             **options)
    error: Exception | None = None
    res: FanOutResult | None = None
    async with anyio.create_task_group() as watch:
        watch.start_soon(abort_on_loss, client, d)
        try:
            res = await answers(client, STEP_METHOD, payload, ranks=d.ranks,
                                timeout=d.timeout, **options)
        except Exception as exc:
            error = exc
        watch.cancel_scope.cancel()
    if error is not None:
        raise error
    return res


async def abort_on_loss(client: ControlClient, d: Dispatch) -> None:
    """Once a rank of ``d`` is lost or restarted, ask the others to abort its step,
    until each says it did or refuses (runs until cancelled otherwise). Never
    raises: the abort is advice; the dispatch's own outcome says what happened."""
    interval = client.liveness.interval or 1.0
    started = {r: client.rank_status(r)["incarnation"] for r in d.ranks}

    def gone(rank: int) -> bool:
        status = client.rank_status(rank)
        return status["state"] == "LOST" or bool(
            started[rank] and status["incarnation"] != started[rank])

    while not any(gone(r) for r in d.ranks):
        with anyio.move_on_after(interval):  # a restart of a live rank is not notified
            await client.liveness.peer_changed.wait()
    others = [r for r in d.ranks if not gone(r)]
    request = AbortStep(d.op_id, d.step, d.phase, d.fence)
    while others:
        try:
            res = await answers(client, ABORT_STEP_METHOD, request, ranks=others,
                                timeout=4 * interval, result_type=bool)
        except Exception:  # the client closed: the dispatch itself says so
            return
        if res is not None:  # done where it aborted, or was refused for good
            others = [r for r in others if res.results.get(r) is not True
                      and (r not in res.errors or retry_safe(res.errors[r]))]
        await anyio.sleep(interval)


def retry_safe(error: Exception) -> bool:
    """Whether a control request's refusal means "ask again": it did not run and may
    another time (``Busy``, ``NotDelivered``), or a step ran meanwhile
    (``StepInFlight``)."""
    return isinstance(error, (Busy, NotDelivered)) or (
        isinstance(error, RemoteError) and error.type_name == "StepInFlight")
