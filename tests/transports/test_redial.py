"""A rank is never cut off for good: a frame above the backstop (``MAXMSGSIZE``)
ends a dialing socket's connection, which libzmq does not dial again; the
transports do, and the rank is routable again within a few heartbeats, in both
directions (real sockets, ipc)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
import zmq

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.redial import SessionWatch
from ctlwire.transports.zmq_client import ZmqDealerClientTransport, ZmqRouterClientTransport
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport, ZmqRouterEngineTransport

pytestmark = pytest.mark.timeout(60)

MIB = 1 << 20


def test_a_disconnection_libzmq_redials_is_left_to_it_and_one_it_does_not_is_due() -> None:
    watch = SessionWatch(grace=1.0)
    watch.note(zmq.EVENT_CONNECTED, 0.0)
    watch.note(zmq.EVENT_DISCONNECTED, 1.0)
    watch.note(zmq.EVENT_CONNECT_RETRIED, 1.0)  # a connection error: libzmq dials again
    assert not watch.due(5.0)
    watch.note(zmq.EVENT_DISCONNECTED, 6.0)  # a protocol error: nothing follows
    assert not watch.due(6.5)
    assert watch.due(7.0)
    watch.redialed()
    assert not watch.due(9.0)


def _ipc(tmp_path: Path) -> str:
    tmp_path.chmod(0o700)
    return f"ipc://{tmp_path}/e.sock"


async def _calls_until_answered(client: ControlClient, within: float) -> int:
    """Small calls until one is answered; how many were tried (fails after ``within``)."""
    tried = 0
    with anyio.fail_after(within):
        while True:
            tried += 1
            try:
                assert await client.call("echo", "small", rank=0, timeout=0.5) == "small"
                return tried
            except AssertionError:
                raise
            except Exception:
                await anyio.sleep(0.1)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["serve", "poll"])
async def test_an_engine_that_dials_is_routable_again_after_a_frame_above_its_backstop(
        mode: str, tmp_path: Path, anyio_backend: str) -> None:
    """The client's limit is 64 MiB, the engine's 16 MiB: a 20 MiB request ends the
    engine's connection. The engine dials again; small calls are answered again."""
    address = _ipc(tmp_path)
    transport = ZmqDealerEngineTransport(address, 0)
    endpoint = EngineEndpoint(transport, heartbeat_interval=0.1)

    @endpoint.method()
    def echo(value: Any = None) -> Any:
        return value

    client = ControlClient(
        ZmqRouterClientTransport(address, codec=MsgpackCodec(max_message_size=64 * MIB)),
        ranks=1, heartbeat_interval=0.1)
    stop = threading.Event()
    async with client, anyio.create_task_group() as tg:
        if mode == "serve":
            tg.start_soon(endpoint.serve)
        else:
            tg.start_soon(anyio.to_thread.run_sync, lambda: endpoint.run_blocking(stop))
        await client.wait_ready(timeout=10)
        assert await client.call("echo", "before", rank=0, timeout=5) == "before"
        with pytest.raises(Exception):  # noqa: B017 - whichever: it never arrives whole
            await client.call("echo", "x" * (20 * MIB), rank=0, timeout=2)
        tried = await _calls_until_answered(client, within=10)
        redials = transport.redials
        stop.set()
        await client.aclose()
        tg.cancel_scope.cancel()
    endpoint.close()
    print(f"\n{mode}: answered again after {tried} tries, redials {redials}")
    assert redials >= 1


@pytest.mark.anyio
async def test_a_client_that_dials_is_connected_again_after_a_reply_above_its_backstop(
        tmp_path: Path, anyio_backend: str) -> None:
    """The engine (it binds) answers 2 MiB to a client whose limit is 1 MiB: the
    client's DEALER loses its connection; it dials again, and small calls work."""
    address = _ipc(tmp_path)
    endpoint = EngineEndpoint(ZmqRouterEngineTransport(address, 0), heartbeat_interval=0.1)

    @endpoint.method()
    def echo(value: Any = None) -> Any:
        return value

    @endpoint.method()
    def blob(size: int) -> str:
        return "x" * size

    transport = ZmqDealerClientTransport([address], codec=MsgpackCodec(max_message_size=MIB))
    client = ControlClient(transport, ranks=1, heartbeat_interval=0.1)
    async with client, anyio.create_task_group() as tg:
        tg.start_soon(endpoint.serve)
        await client.wait_ready(timeout=10)
        assert await client.call("echo", "before", rank=0, timeout=5) == "before"
        with pytest.raises(Exception):  # noqa: B017 - the reply never arrives whole
            await client.call("blob", 2 * MIB, rank=0, timeout=2)
        tried = await _calls_until_answered(client, within=10)
        redials = transport.counters["redials"]
        await client.aclose()
        tg.cancel_scope.cancel()
    print(f"\nclient: answered again after {tried} tries, redials {redials}")
    assert redials >= 1
