"""The engine's own guards never end it: an unexpected exception while receiving
(decoding) a frame, dispatching a request, sending a reply or sending a
heartbeat is counted, and the next call is answered -- under ``poll()``,
``serve()`` and a :class:`~ctlwire.kernel.engine.busy_loop.BusyLoop` (real zmq sockets
over ipc, the engine in this process so that each fault is injected exactly
once where it is meant to be)."""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from forwarding_transport import Forwarding

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.engine.busy_loop import BusyLoop
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.errors import RequestTimedOut
from ctlwire.transports.envelope import Envelope, Heartbeat
from ctlwire.transports.transport import EngineTransport, Route, TransportEvent
from ctlwire.transports.zmq_client import ZmqRouterClientTransport
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

ANSWER = 10.0  # what a live engine answers well within


class Injected(RuntimeError):
    """The unexpected exception: not a transport error the engine expects."""


class OneFault:
    """Raises :class:`Injected` once, the next time an armed point is reached."""

    def __init__(self) -> None:
        self.armed: set[str] = set()
        self.raised: list[str] = []
        self._lock = threading.Lock()

    def arm(self, point: str) -> None:
        with self._lock:
            self.armed.add(point)

    def at(self, point: str) -> None:
        with self._lock:
            if point not in self.armed:
                return
            self.armed.discard(point)
            self.raised.append(point)
        raise Injected(point)


class FaultyTransport(Forwarding):
    """An engine transport that raises where :class:`OneFault` is armed: ``decode``
    (taking the next frame), ``send`` (a reply), ``heartbeat``."""

    def __init__(self, inner: EngineTransport, fault: OneFault) -> None:
        super().__init__(inner)
        self.fault = fault

    def try_receive(self) -> TransportEvent | None:
        self.fault.at("decode")
        return self.inner.try_receive()

    def receive_one(self, timeout: float = 0.0) -> TransportEvent | None:
        self.fault.at("decode")
        return self.inner.receive_one(timeout)

    async def receive(self) -> TransportEvent:
        self.fault.at("decode")
        return await self.inner.receive()

    def send_nowait(self, route: Route, envelope: Envelope) -> None:
        self.fault.at("heartbeat" if type(envelope) is Heartbeat else "send")
        self.inner.send_nowait(route, envelope)

    def send_encoded_nowait(self, route: Route, data: bytes) -> None:  # replies, encoded
        self.fault.at("send")
        self.inner.send_encoded_nowait(route, data)


def faulty_dispatch(ep: EngineEndpoint, fault: OneFault) -> None:
    """Dispatch (handing an admitted request to where its handler runs) raises
    where ``fault`` is armed at ``dispatch``."""
    runner = ep.runner
    run_sync, run_async = runner.run_sync, runner.run_async

    def sync(item: Any) -> Any:
        fault.at("dispatch")
        return run_sync(item)

    async def run_in_lane(item: Any) -> Any:
        fault.at("dispatch")
        return await run_async(item)

    runner.run_sync = sync  # type: ignore[method-assign]
    runner.run_async = run_in_lane  # type: ignore[method-assign]


def register(ep: EngineEndpoint) -> None:
    @ep.method()
    def echo(value: Any = None) -> Any:  # state-changing: the busy loop's thread runs it
        return value

    @ep.method(read_only=True)
    def info() -> str:
        return "info"


@asynccontextmanager
async def running_engine(mode: str, address: str, fault: OneFault,
                         backend: str) -> AsyncIterator[EngineEndpoint]:
    """An engine on ``address`` with the faulty transport, run in ``mode``."""
    transport = FaultyTransport(ZmqDealerEngineTransport(address, rank=0), fault)
    ep = EngineEndpoint(transport, beacon=False)
    if mode == "loop":
        loop = BusyLoop(ep, backend=backend)
        register(ep)
        faulty_dispatch(ep, fault)
        stop = threading.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: anyio.to_thread.run_sync(lambda: loop.run_blocking(stop)))
            try:
                yield ep
            finally:
                stop.set()
        return
    register(ep)
    faulty_dispatch(ep, fault)
    if mode == "poll":
        stop = threading.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: anyio.to_thread.run_sync(
                lambda: ep.run_blocking(stop, idle_wait=0.01)))
            try:
                yield ep
            finally:
                stop.set()
        return
    async with anyio.create_task_group() as tg:
        await tg.start(lambda task_status: ep.serve(task_status=task_status))
        try:
            yield ep
        finally:
            tg.cancel_scope.cancel()


async def until(cond: Callable[[], bool]) -> None:
    with anyio.fail_after(ANSWER):
        while not cond():
            await anyio.sleep(0.01)


@pytest.mark.parametrize("mode", ["poll", "serve", "loop"])
@pytest.mark.parametrize("point", ["decode", "dispatch", "send", "heartbeat"])
async def test_an_unexpected_error_is_counted_and_the_next_call_answered(
        mode: str, point: str, tmp_path: Path, anyio_backend: str) -> None:
    os.chmod(tmp_path, 0o700)
    address = f"ipc://{tmp_path}/e.sock"
    fault = OneFault()
    client = ControlClient(ZmqRouterClientTransport(address), ranks=1, default_timeout=ANSWER)
    async with client, running_engine(mode, address, fault, anyio_backend) as ep:
        await client.wait_ready(timeout=ANSWER)
        assert await client.call("echo", "before") == "before"
        fault.arm(point)
        if point in ("dispatch", "send"):  # this call's reply is what the error lost
            with pytest.raises(RequestTimedOut):
                await client.call("echo", "lost", timeout=0.5)
        elif point == "heartbeat":
            await until(lambda: ep.counters["heartbeat_failures"] == 1)
        else:  # a receive already waiting when armed may take this call: then the next raises
            assert await client.call("echo", "first") == "first"
        await until(lambda: bool(fault.raised))
        assert fault.raised == [point]
        assert await client.call("echo", "after") == "after"
        assert await client.call("info") == "info"
        counters = ep.counters
    errors = (counters["internal_errors"], counters["heartbeat_failures"])
    assert errors == ((0, 1) if point == "heartbeat" else (1, 0)), counters
