"""``receive_or_handle(handle, until)`` and ``interrupt_receive()`` on the ZeroMQ
router client transport: the
receive ends empty as soon as ``until()`` holds, takes nothing more, and a
suspended one ends when interrupted."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import zmq

from ctlwire.transports.envelope import Reply
from ctlwire.transports.zmq_client import ZmqRouterClientTransport
from ctlwire.transports.zmq_config import rank_identity

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


@asynccontextmanager
async def _client(tmp_path: Path) -> AsyncIterator[tuple[Any, zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    engine = ctx.socket(zmq.DEALER)
    engine.setsockopt(zmq.LINGER, 0)
    engine.setsockopt(zmq.IDENTITY, rank_identity(0))
    try:
        inner = ZmqRouterClientTransport(f"ipc://{tmp_path}/c.sock")
        async with inner:
            engine.connect(inner.address)
            yield inner, engine
    finally:
        engine.close(0)
        ctx.term()


async def test_until_stops_at_a_message_boundary_and_takes_nothing_more(tmp_path: Path) -> None:
    async with _client(tmp_path) as (client, engine):
        codec = client.codec
        handled: list[int] = []
        stop_after = {3}

        def handle(event: Any) -> bool:
            handled.append(event.envelope.id)
            return True

        def until() -> bool:
            return bool(stop_after & set(handled))

        for i in range(1, 7):
            engine.send(codec.encode(Reply(i, 0, 1, True, b"\xc0")))
        time.sleep(0.2)  # all queued at the client
        with anyio.fail_after(5):
            assert await client.receive_or_handle(handle, until) is None
        assert handled == [1, 2, 3]  # ended right after the message that made it True
        with anyio.fail_after(5):
            assert await client.receive_or_handle(handle, lambda: True) is None
        assert handled == [1, 2, 3]  # already True: nothing taken
        stop_after.clear()
        stop_after.add(6)
        with anyio.fail_after(5):
            assert await client.receive_or_handle(handle, until) is None
        assert handled == [1, 2, 3, 4, 5, 6]  # the rest, in order, nothing lost


async def test_interrupt_ends_a_suspended_receive_whose_until_holds(tmp_path: Path) -> None:
    async with _client(tmp_path) as (client, engine):
        codec = client.codec
        handled: list[int] = []
        stop = False
        ended: list[Any] = []

        def handle(event: Any) -> bool:
            handled.append(event.envelope.id)
            return True

        async def receive() -> None:
            ended.append(await client.receive_or_handle(handle, lambda: stop))

        async with anyio.create_task_group() as tg:
            tg.start_soon(receive)
            await anyio.sleep(0.2)
            client.interrupt_receive()  # until() is False: it goes on waiting
            await anyio.sleep(0.2)
            assert ended == []
            stop = True
            client.interrupt_receive()
            with anyio.fail_after(5):
                while not ended:
                    await anyio.sleep(0.01)
        assert ended == [None] and handled == []
        client.interrupt_receive()  # nobody receives: no effect
        engine.send(codec.encode(Reply(9, 0, 1, True, b"\xc0")))
        with anyio.fail_after(5):
            while not handled:
                assert await client.receive_or_handle(handle, lambda: bool(handled)) is None
        assert handled == [9]
