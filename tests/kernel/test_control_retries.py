"""A controller asks control requests again when the engine says "ask again":
``Busy`` (no room now), ``NotDelivered`` and ``StepInFlight``, until its deadline;
any other refusal is final."""

from __future__ import annotations

import time

import pytest

from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.engine.ledger_messages import LastOperation, TakeOver
from ctlwire.kernel.engine.operation_ledger import TAKE_OVER_METHOD
from ctlwire.kernel.engine.step_refusals import Fenced
from ctlwire.kernel.errors import Busy, NotDelivered, OutcomeUnknown, RemoteError
from ctlwire.kernel.operations.ledger_reads import read_last_operations
from ctlwire.kernel.operations.step_dispatch import retry_safe
from ctlwire.testing import EngineHarness

pytestmark = pytest.mark.anyio


class EngineBusy(Exception):
    """Raised by the test engine's take-over: answered with type ``Busy``, code 429."""

    code = 429


EngineBusy.__name__ = "Busy"


def test_what_asks_again() -> None:
    assert retry_safe(Busy("Busy", "full", 429))
    assert retry_safe(NotDelivered(0, "not connected"))
    assert retry_safe(RemoteError("StepInFlight", "a step runs", 409))
    assert not retry_safe(RemoteError("Fenced", "older", 409))
    assert not retry_safe(OutcomeUnknown(0, "lost"))


@pytest.mark.parametrize("refusal", ["Busy", "Fenced"])
async def test_a_take_over_refused_busy_is_asked_again_and_a_final_refusal_is_not(
        refusal: str, anyio_backend: str) -> None:
    asked: list[float] = []

    def setup(ep: EngineEndpoint) -> None:
        def take_over(req: TakeOver) -> LastOperation:
            asked.append(time.monotonic())
            if len(asked) < 3:
                raise EngineBusy("no room") if refusal == "Busy" else Fenced("older")
            return LastOperation(ep.rank, highest_fence=req.fence)

        ep.register(TAKE_OVER_METHOD, take_over, threaded=True, control=True)

    async with EngineHarness(1, setup) as h:
        await h.client.wait_ready(timeout=10)
        out = await read_last_operations(h.client, [0], timeout=10, fence=5)
    if refusal == "Busy":
        assert len(asked) == 3
        result = out[0]
        assert isinstance(result, LastOperation) and result.highest_fence == 5
    else:
        assert len(asked) == 1
        assert isinstance(out[0], RemoteError) and out[0].type_name == "Fenced"
