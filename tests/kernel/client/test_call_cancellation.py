"""A call over real sockets that its caller cancels while it waits: nothing is
left in the request map, the engine's late reply is counted, and the client
goes on serving calls."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.transports.zmq_client import ZmqRouterClientTransport
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport

pytestmark = pytest.mark.timeout(60)


@pytest.mark.anyio
async def test_a_call_cancelled_while_it_waits_leaves_nothing_and_a_late_reply_is_counted(
        tmp_path: Path) -> None:
    transport = ZmqRouterClientTransport(f"ipc://{tmp_path}/c.sock")
    release = anyio.Event()
    async with ControlClient(transport, ranks=1, default_timeout=10.0) as client, \
            anyio.create_task_group() as tg:
        ep = EngineEndpoint(ZmqDealerEngineTransport(transport.address, 0))

        async def slow() -> str:
            await release.wait()
            return "late"

        ep.register("slow", slow)
        await tg.start(ep.serve)
        await client.wait_ready(timeout=10)
        with anyio.move_on_after(0.2) as scope:
            await client.call("slow")
        assert scope.cancelled_caught
        assert client.registry.live_count == 0
        release.set()
        with anyio.fail_after(5):
            while client.registry.stats.late == 0:
                await anyio.sleep(0.01)
        assert await client.call("ctlwire.metrics") is not None
        tg.cancel_scope.cancel()
    assert client.registry.stats.cleaned == 2
