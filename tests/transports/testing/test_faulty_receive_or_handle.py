"""``FaultyClientTransport.receive_or_handle``: the fault-injecting wrapper keeps the
client's hand-over path (replies handled where they arrive, not by the receiving
task), over the wrapped transport's own ``receive_or_handle``, with the faults
still applied and buffered events kept in order."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import pytest

from ctlwire.transports.envelope import Reply
from ctlwire.transports.memory import MemoryNetwork
from ctlwire.transports.testing import FaultPlan, FaultyClientTransport
from ctlwire.transports.transport import Received, TransportEvent
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


class CountingRouter(ZmqRouterClientTransport):
    """Counts which receive the wrapper's pump uses."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plain_receives = 0
        self.handing_receives = 0

    async def receive(self) -> TransportEvent:
        self.plain_receives += 1
        return await super().receive()

    async def receive_or_handle(self, handle: Any) -> TransportEvent:
        self.handing_receives += 1
        return await super().receive_or_handle(handle)


async def test_buffered_events_keep_their_order_and_a_handler_error_is_raised() -> None:
    """Events buffered before the receiver registers its handler are handed to it in
    order by the receiving task; a declined event is returned; what the handler
    raises where an event arrives is raised by the receive."""
    net = MemoryNetwork()
    async with (FaultyClientTransport(net.client_transport(), FaultPlan()) as client,
                net.engine_transport(0) as engine):
        def reply(i: int) -> None:
            engine.send_nowait(None, Reply(i, 0, 1, True, msgspec.Raw(b"\xc0")))

        for i in range(4):
            reply(i)
        await anyio.wait_all_tasks_blocked()  # the pump buffered them
        seen: list[int] = []

        def handle(event: TransportEvent) -> bool:
            assert isinstance(event, Received) and isinstance(event.envelope, Reply)
            rid = event.envelope.id
            seen.append(rid)
            if rid == 6:
                raise RuntimeError("handler failed on 6")
            return rid != 2  # 2 is declined: returned to the receiver

        event = await client.receive_or_handle(handle)
        assert isinstance(event, Received) and isinstance(event.envelope, Reply)
        assert event.envelope.id == 2 and seen == [0, 1, 2]
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                async def receiver() -> None:
                    with pytest.raises(RuntimeError, match="on 6"):
                        await client.receive_or_handle(handle)

                tg.start_soon(receiver)
                await anyio.wait_all_tasks_blocked()  # 3 handled; now waiting
                inline = client.handled_inline
                for i in (4, 5, 6):
                    reply(i)
                    await anyio.wait_all_tasks_blocked()
        assert seen == [0, 1, 2, 3, 4, 5, 6]
        assert client.handled_inline == inline + 2  # 4 and 5 where they arrived
        # declined where it arrived (the receiver waiting): returned, handed over once
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                got: list[TransportEvent] = []

                async def receiver2() -> None:
                    got.append(await client.receive_or_handle(handle))

                tg.start_soon(receiver2)
                await anyio.wait_all_tasks_blocked()
                reply(2)
        assert len(got) == 1 and isinstance(got[0], Received)
        assert isinstance(got[0].envelope, Reply) and got[0].envelope.id == 2
        assert seen == [0, 1, 2, 3, 4, 5, 6, 2]
