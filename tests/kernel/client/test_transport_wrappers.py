"""A user's own ClientTransport, written against the protocol's required methods
(no ``receive_many``): the client reads it with ``receive()``, one event a call,
and a wrapper that forwards other attributes to the transport it wraps is never
bypassed."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import pytest

from ctlwire.kernel import ControlClient, EngineEndpoint, EngineHarness
from ctlwire.transports import ClientTransport, MemoryNetwork
from ctlwire.transports.envelope import Envelope
from ctlwire.transports.transport import TransportEvent

pytestmark = pytest.mark.anyio


def methods(ep: EngineEndpoint) -> None:
    @ep.method()
    def echo(value: Any = None) -> Any:
        return value


class CountingTransport(ClientTransport):
    """The protocol's required methods only, each forwarded; counts what it receives."""

    def __init__(self, inner: ClientTransport) -> None:
        self.inner = inner
        self.codec = inner.codec
        self.received = 0

    async def __aenter__(self) -> CountingTransport:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.inner.__aexit__(exc_type, exc, tb)

    def send_nowait(self, rank: int, envelope: Envelope) -> None:
        self.inner.send_nowait(rank, envelope)

    async def send(self, rank: int, envelope: Envelope) -> None:
        await self.inner.send(rank, envelope)

    async def receive(self) -> TransportEvent:
        event = await self.inner.receive()
        self.received += 1
        return event


class ForwardingTransport(CountingTransport):
    """The same, plus every other attribute forwarded to the wrapped transport
    (``receive_many`` included): its own ``receive`` must still see every event."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("wrapper", [CountingTransport, ForwardingTransport])
async def test_a_transport_without_receive_many_is_read_with_receive(
        wrapper: type[CountingTransport]) -> None:
    wrapped: list[CountingTransport] = []

    def wrap(inner: ClientTransport) -> ClientTransport:
        wrapped.append(wrapper(inner))
        return wrapped[0]

    async with EngineHarness(ranks=2, setup=methods, wrap_client=wrap) as h:
        assert await h.client.call("echo", 7, rank=1, timeout=10) == 7
        res = await h.client.fan_out("echo", "all", timeout=10)
        assert res.results == {0: "all", 1: "all"}
    assert wrapped[0].received >= 3  # both replies came through the wrapper's receive


async def test_a_transport_that_cannot_receive_is_refused_by_name() -> None:
    class NoReceive:
        codec = MemoryNetwork().client_transport().codec

    with pytest.raises(TypeError, match=r"NoReceive.*receive\(\)"):
        ControlClient(NoReceive(), ranks=1)  # type: ignore[arg-type]
