"""The one-rank call's own steps: its checkpoint comes before anything is registered.
Virtual time on asyncio and trio."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.testing import EngineHarness

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
