"""The one-rank call's own steps: its checkpoint comes before anything is registered,
and the envelope carries the call's wall-clock deadline (none for an infinite budget).
Virtual time on asyncio and trio."""

from __future__ import annotations

import math
import time
from typing import Any

import anyio
import pytest

from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.testing import EngineHarness
from ctlwire.transports.envelope import NO_DEADLINE, Request
from ctlwire.transports.memory import MemoryClientTransport

pytestmark = [pytest.mark.anyio, pytest.mark.ctlwire_virtual_clock]


def _echo(ep: EngineEndpoint) -> None:
    def echo(payload: Any = None) -> Any:
        return payload

    ep.register("echo", echo)


async def test_a_caller_cancelled_before_its_call_registers_nothing() -> None:
    async with EngineHarness(ranks=1, setup=_echo) as h:
        stats = h.client.registry.stats
        assert await h.client.call("echo", 1) == 1
        with anyio.CancelScope() as scope:
            scope.cancel()
            await h.client.call("echo", 2)
        assert scope.cancelled_caught
        assert stats.registered == stats.cleaned == 1  # the cancelled call left no entry
        assert h.client.registry.live_count == 0
        assert await h.client.call("echo", 3) == 3


async def test_the_envelope_carries_the_call_deadline_and_none_for_an_infinite_budget() -> None:
    seen: list[Request] = []

    class Spy(MemoryClientTransport):
        def send_nowait(self, rank: int, envelope: Any) -> None:
            if isinstance(envelope, Request):
                seen.append(envelope)
            super().send_nowait(rank, envelope)

    async with EngineHarness(ranks=1, setup=_echo) as h:
        h.network._client.__class__ = Spy  # type: ignore[union-attr]
        before = time.time()
        assert await h.client.call("echo", "a", timeout=math.inf) == "a"
        assert await h.client.call("echo", "b", timeout=5.0) == "b"
        after = time.time()
        unbounded, bounded = seen
        assert unbounded.deadline == NO_DEADLINE
        assert before + 5.0 <= bounded.deadline <= after + 5.0
