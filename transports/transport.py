"""The interface every transport implements, and the events it reports.

A transport moves encoded envelopes between one API-side client and engine
ranks. It reports what it sees — :class:`Received` envelopes,
:class:`Dropped` frames, :class:`PeerDisconnected` peers — and leaves their
meaning (request states, liveness) to the kernel.

Guarantees every implementation gives:

* Frames between one client and one rank are delivered in send order (or not
  at all); nothing is delivered twice unless the peer sent it twice.
* ``send_nowait`` never blocks: it raises
  :class:`~ctlwire.transports.errors.WouldBlock` at the high-water mark and
  :class:`~ctlwire.transports.errors.Unroutable` when the rank has no connected
  peer. ``send`` waits for room instead of raising WouldBlock.
* A frame that cannot be decoded is reported as :class:`Dropped` (with a
  reply route when one exists) and never ends the receive loop.
* ``receive`` raises :class:`~ctlwire.transports.errors.TransportClosed` once
  the transport is closed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Iterable
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

import msgspec

from ctlwire.transports.codec import Codec
from ctlwire.transports.envelope import Envelope

__all__ = [
    "ClientTransport",
    "Dropped",
    "EngineTransport",
    "PeerDisconnected",
    "Received",
    "Route",
    "TransportEvent",
    "batch_receiver",
    "encoded_sender",
]

Route = Hashable
"""Where an engine sends a reply: opaque, chosen by the transport."""


class Received(msgspec.Struct, frozen=True, gc=False):
    """A decoded envelope. ``peer`` is the rank of the connection it came in on,
    when the transport knows it (client side); ``route`` is where a reply goes
    (engine side)."""

    envelope: Envelope
    peer: int | None = None
    route: Any = None  # a Route
    size: int = 0


class Dropped(msgspec.Struct, frozen=True, gc=False):
    """A frame that was not delivered as an envelope.

    ``reason`` is one of ``"malformed"``, ``"oversized"``, ``"framing"`` (wrong
    number of frames). ``request_id`` is the id salvaged from the frame when
    one could be read (0 otherwise) and ``route`` the reply address, so the
    receiver can answer with a typed error.
    """

    reason: str
    detail: str
    size: int
    peer: int | None = None
    route: Any = None  # a Route
    request_id: int = 0


class PeerDisconnected(msgspec.Struct, frozen=True, gc=False):
    """The transport saw a connection to ``rank`` end (socket monitor, closed pipe)."""

    rank: int | None
    detail: str = ""


TransportEvent = Received | Dropped | PeerDisconnected


@runtime_checkable
class ClientTransport(Protocol):
    """API-server side: one socket (or one per rank) to all engine ranks.

    Use as an async context manager: entering binds or connects, exiting
    closes without hanging (bounded linger).

    Optional, found on the transport's class when it defines them (a wrapper
    that forwards other attributes is never bypassed): ``receive_many(limit)``
    (the next event and those queued behind it, in order; see
    :func:`batch_receiver`), ``send_encoded_nowait`` (:func:`encoded_sender`)
    and ``batched_sends()``. A transport with only the methods below works.
    """

    codec: Codec

    async def __aenter__(self) -> ClientTransport: ...

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None: ...

    def send_nowait(self, rank: int, envelope: Envelope) -> None:
        """Send to ``rank`` now; raises Unroutable, WouldBlock, TransportClosed."""

    async def send(self, rank: int, envelope: Envelope) -> None:
        """Send to ``rank``, waiting for room; raises Unroutable, TransportClosed."""

    async def receive(self) -> TransportEvent:
        """The next event; raises TransportClosed once closed."""


def batch_receiver(transport: Any) -> Callable[[], Awaitable[list[TransportEvent]]]:
    """What a receive loop awaits: ``transport.receive_many`` (the next event,
    waiting for one, and those already queued behind it, in order) when the
    transport's class defines it, else ``receive()`` as a list of one event.
    Asked of the class, as :func:`encoded_sender` is. TypeError naming the
    transport when it has no ``receive()`` either."""
    if hasattr(type(transport), "receive_many"):
        many: Callable[[], Awaitable[list[TransportEvent]]] = transport.receive_many
        return many
    receive = getattr(transport, "receive", None)
    if not callable(receive):
        raise TypeError(f"{type(transport).__name__} is not a ClientTransport: it has no "
                        "receive() (nor receive_many())")

    async def receive_one() -> list[TransportEvent]:
        return [await receive()]

    return receive_one


def encoded_sender(transport: Any) -> Callable[[int, bytes], None] | None:
    """``transport.send_nowait`` for bytes already encoded with its codec
    (``send_encoded_nowait``), when the transport's class defines one, else None.
    Asked of the class: a wrapper that forwards attributes but intercepts
    ``send_nowait`` is never bypassed."""
    if not hasattr(type(transport), "send_encoded_nowait"):
        return None
    send: Callable[[int, bytes], None] = transport.send_encoded_nowait
    return send


@runtime_checkable
class EngineTransport(Protocol):
    """Engine side: receives requests for one rank, sends replies and heartbeats.

    Usable from an async engine (``async with``, :meth:`receive`) and from a
    synchronous busy loop (:meth:`open`, :meth:`try_receive`,
    :meth:`wait_readable`, :meth:`close`).
    """

    codec: Codec
    rank: int

    def open(self) -> None:
        """Bind or connect; idempotent."""

    def close(self) -> None:
        """Close with a bounded linger; idempotent; never hangs."""

    async def __aenter__(self) -> EngineTransport: ...

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None: ...

    def try_receive(self) -> TransportEvent | None:
        """The next event if one is ready, else None. Never blocks."""

    def wait_readable(self, timeout: float) -> bool:
        """Block the calling thread up to ``timeout`` s for input (sync engines)."""

    async def receive(self) -> TransportEvent:
        """The next event; raises TransportClosed once closed."""

    def send_nowait(self, route: Route, envelope: Envelope) -> None:
        """Send now; raises WouldBlock, Unroutable, TransportClosed."""

    async def send(self, route: Route, envelope: Envelope) -> None:
        """Send, waiting for room."""

    def heartbeat_routes(self) -> Iterable[Route]:
        """Where this engine's heartbeats go (the clients it has heard from or connects to)."""
