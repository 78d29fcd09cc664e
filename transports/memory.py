"""An in-memory transport: one client and N engine ranks in one event loop.

Frames are really encoded and decoded (the same codec as on a socket), carried
by bounded anyio memory object streams. Same interface and guarantees as the
ZeroMQ transports, so the kernel is testable without sockets; not for
production. Closing an engine transport reports :class:`PeerDisconnected` to
the client, like a socket monitor would.

``MemoryNetwork.inject_to_engine`` / ``inject_to_client`` put raw bytes on the
wire, for tests of malformed input.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ctlwire.transports.codec import Codec, MsgpackCodec
from ctlwire.transports.envelope import Envelope
from ctlwire.transports.errors import (
    MalformedFrame,
    OversizedFrame,
    TransportClosed,
    Unroutable,
    WouldBlock,
)
from ctlwire.transports.transport import (
    ClientTransport,
    Dropped,
    EngineTransport,
    PeerDisconnected,
    Received,
    Route,
    TransportEvent,
)

__all__ = ["MemoryClientTransport", "MemoryEngineTransport", "MemoryNetwork"]

# (peer rank or None, raw bytes) for frames; PeerDisconnected for link events.
_Item = Any


def decode_event(codec: Codec, data: bytes, peer: int | None, route: Route) -> TransportEvent:
    """Decode one frame into Received or Dropped (shared by transports)."""
    try:
        env = codec.decode(data)
    except OversizedFrame as exc:  # answered like a malformed frame: its id is read
        return Dropped("oversized", str(exc), len(data), peer, route, codec.salvage_id(data))
    except MalformedFrame as exc:
        return Dropped("malformed", str(exc), len(data), peer, route, codec.salvage_id(data))
    return Received(env, peer, route, len(data))


class MemoryNetwork:
    """A hub joining one client transport and any number of engine transports."""

    def __init__(self, codec: Codec | None = None, buffer: int = 1024) -> None:
        self.codec = codec or MsgpackCodec()
        self.buffer = buffer
        self._engines: dict[int, MemoryEngineTransport] = {}
        self._client: MemoryClientTransport | None = None

    def client_transport(self) -> MemoryClientTransport:
        if self._client is not None and not self._client.closed:
            raise RuntimeError("this MemoryNetwork already has an open client transport")
        self._client = MemoryClientTransport(self)
        return self._client

    def engine_transport(self, rank: int) -> MemoryEngineTransport:
        return MemoryEngineTransport(self, rank)

    # -- wiring used by the two ends ------------------------------------------------
    @property
    def client(self) -> MemoryClientTransport | None:
        """The client transport made last (open or closed), if any."""
        return self._client

    def attach(self, engine: MemoryEngineTransport) -> None:
        """``engine`` opened: it serves its rank (RuntimeError if another open one does)."""
        current = self._engines.get(engine.rank)
        if current is not None and current is not engine and not current.closed:
            raise RuntimeError(f"rank {engine.rank} already has an open engine transport")
        self._engines[engine.rank] = engine

    def detach(self, engine: MemoryEngineTransport) -> None:
        """``engine`` closed: the client hears its rank disconnected."""
        if self._engines.get(engine.rank) is engine:
            del self._engines[engine.rank]
            client = self._client
            if client is not None and not client.closed:
                client.deliver_nowait(PeerDisconnected(engine.rank, "engine transport closed"))

    def engine(self, rank: int) -> MemoryEngineTransport:
        """The open engine transport of ``rank``; raises Unroutable without one."""
        engine = self._engines.get(rank)
        if engine is None or engine.closed:
            raise Unroutable(rank, "no engine transport open for this rank")
        return engine

    def inject_to_engine(self, rank: int, data: bytes) -> None:
        """Deliver raw bytes to ``rank`` as if the client had sent them."""
        self.engine(rank).deliver_nowait((None, data))

    def inject_to_client(self, rank: int, data: bytes) -> None:
        """Deliver raw bytes to the client as if ``rank`` had sent them."""
        if self._client is None or self._client.closed:
            raise TransportClosed("no open client transport")
        self._client.deliver_nowait((rank, data))


class _Endpoint:
    def __init__(self, network: MemoryNetwork) -> None:
        self.network = network
        self.codec = network.codec
        send, recv = anyio.create_memory_object_stream[_Item](network.buffer)
        self._in_send: MemoryObjectSendStream[_Item] = send
        self._in_recv: MemoryObjectReceiveStream[_Item] = recv
        self.closed = False

    def deliver_nowait(self, item: _Item) -> None:
        """Put ``item`` in this end's input, as the wire does; WouldBlock when full."""
        if self.closed:
            raise TransportClosed("peer transport is closed")
        try:
            self._in_send.send_nowait(item)
        except anyio.WouldBlock:
            raise WouldBlock("in-memory buffer full") from None

    async def deliver(self, item: _Item) -> None:
        """Put ``item`` in this end's input, waiting for room."""
        if self.closed:
            raise TransportClosed("peer transport is closed")
        try:
            await self._in_send.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise TransportClosed("peer transport is closed") from None

    def _to_event(self, item: _Item) -> TransportEvent:
        if isinstance(item, PeerDisconnected):
            return item
        peer, data = item
        return decode_event(self.codec, data, peer, peer)

    def try_receive(self) -> TransportEvent | None:
        if self.closed:
            raise TransportClosed("transport is closed")
        try:
            item = self._in_recv.receive_nowait()
        except anyio.WouldBlock:
            return None
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise TransportClosed("transport is closed") from None
        return self._to_event(item)

    async def receive(self) -> TransportEvent:
        try:
            item = await self._in_recv.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise TransportClosed("transport is closed") from None
        return self._to_event(item)

    async def receive_many(self, limit: int = 64) -> list[TransportEvent]:
        """The next event (waiting for one) and those queued behind it, up to ``limit``."""
        events = [await self.receive()]
        while len(events) < limit:
            try:
                event = self.try_receive()
            except TransportClosed:
                break  # the next call raises it
            if event is None:
                break
            events.append(event)
        return events

    def _close_streams(self) -> None:
        self.closed = True
        self._in_send.close()
        self._in_recv.close()


class MemoryClientTransport(_Endpoint, ClientTransport):
    """The client end. ``peer`` of every received frame is the sending rank."""

    async def __aenter__(self) -> MemoryClientTransport:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self._close_streams()

    async def aclose(self) -> None:
        self._close_streams()

    def send_nowait(self, rank: int, envelope: Envelope) -> None:
        if self.closed:
            raise TransportClosed("client transport is closed")
        data = self.codec.encode(envelope)
        self.network.engine(rank).deliver_nowait((None, data))

    async def send(self, rank: int, envelope: Envelope) -> None:
        if self.closed:
            raise TransportClosed("client transport is closed")
        data = self.codec.encode(envelope)
        await self.network.engine(rank).deliver((None, data))


class MemoryEngineTransport(_Endpoint, EngineTransport):
    """The engine end for one rank. Replies go to the network's client. It lives in
    an event loop: a poll loop drives it from a task, never blocking a thread
    (:meth:`wait_readable` is not offered)."""

    def __init__(self, network: MemoryNetwork, rank: int) -> None:
        super().__init__(network)
        self.rank = rank
        self._opened = False

    def open(self) -> None:
        if self.closed:
            raise TransportClosed("engine transport is closed")
        if not self._opened:
            self.network.attach(self)
            self._opened = True

    def close(self) -> None:
        if self.closed:
            return
        self._close_streams()
        self.network.detach(self)

    def _client(self) -> MemoryClientTransport:
        client = self.network.client
        if client is None or client.closed:
            raise Unroutable(self.rank, "no client transport open")
        return client

    def send_encoded_nowait(self, route: Route, data: bytes) -> None:
        if self.closed:
            raise TransportClosed("engine transport is closed")
        self._client().deliver_nowait((self.rank, data))

    def heartbeat_routes(self) -> Iterable[Route]:
        client = self.network.client
        return () if client is None or client.closed else (None,)
