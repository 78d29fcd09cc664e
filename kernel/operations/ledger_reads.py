"""Reading the ranks' operation ledgers over a client: what each last applied
(``ctlwire.last_operation``), or the same after taking the rank over with a newer
fence (``ctlwire.take_over``), for restart recovery
(:meth:`~ctlwire.kernel.operations.runner.OperationRunner.last_operations`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio

from ctlwire.kernel.engine.operation_ledger import (
    LAST_OPERATION_METHOD,
    TAKE_OVER_METHOD,
    LastOperation,
    TakeOver,
)
from ctlwire.kernel.errors import RequestTimedOut
from ctlwire.kernel.operations.step_dispatch import retry_safe
from ctlwire.kernel.operations.step_outcomes import answers

if TYPE_CHECKING:
    from ctlwire.kernel.client.control_client import ControlClient

__all__ = ["read_last_operations"]


async def read_last_operations(client: ControlClient, targets: Sequence[int],
                               timeout: float, fence: int | None
                               ) -> dict[int, LastOperation | Exception]:
    """Each of ``targets``' answer, or the error that took its place (a rank
    that gave none within ``timeout``: RequestTimedOut). With ``fence``, each
    rank is taken over first; one refusing with ``StepInFlight`` (a step runs
    there) is asked again until ``timeout``."""
    method = LAST_OPERATION_METHOD if fence is None else TAKE_OVER_METHOD
    payload = None if fence is None else TakeOver(fence)
    out: dict[int, LastOperation | Exception] = {}
    ask = tuple(targets)
    with anyio.move_on_after(timeout):
        while ask:
            res = await answers(client, method, payload, ranks=ask, timeout=timeout,
                                result_type=LastOperation)
            if res is None:
                break
            busy = []
            for rank in ask:
                if rank in res.results:
                    out[rank] = res.results[rank]
                    continue
                error = res.errors.get(rank)
                if error is not None:
                    out[rank] = error
                    if retry_safe(error):
                        busy.append(rank)
            ask = tuple(busy)
            if ask:
                await anyio.sleep(0.05)
    for rank in targets:
        out.setdefault(rank, RequestTimedOut(method, timeout))
    return out
