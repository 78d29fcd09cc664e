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
  peer. A client's ``send`` waits for room instead of raising WouldBlock.
* A frame that cannot be decoded is reported as :class:`Dropped` (with a
  reply route when one exists) and never ends the receive loop.
* ``receive`` raises :class:`~ctlwire.transports.errors.TransportClosed` once
  the transport is closed.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Hashable, Iterable
from types import TracebackType
from typing import Any, Protocol, TypeVar, runtime_checkable

import msgspec

from ctlwire.transports.codec import Codec
from ctlwire.transports.envelope import Envelope, Heartbeat

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


_E = TypeVar("_E", bound="EngineTransport")


class EngineTransport(abc.ABC):
    """Engine side: receives requests for one rank, sends replies and heartbeats.

    Every engine transport derives from this class. It implements the three
    abstract methods: :meth:`try_receive` (a synchronous loop's receive),
    :meth:`receive` (an event loop's) and :meth:`send_encoded_nowait` (every
    send). Every other member has a default built on them, or the neutral answer
    of a transport that has no such thing (no beacon, no upkeep, nothing refused);
    a transport overrides what it has more to say about. This is all an endpoint
    asks of a transport: it looks nothing else up.

    Used from a synchronous loop (:meth:`open`, :meth:`receive_one`,
    :meth:`close`) or from an event loop (``async with``, :meth:`receive`).
    """

    codec: Codec
    rank: int
    #: frames carry a routing identity (a ROUTER): heartbeats reach every peer that
    #: connects, not only a request's sender
    routed: bool = False

    @abc.abstractmethod
    def try_receive(self) -> TransportEvent | None:
        """The next event if one is ready, else None. Never blocks; raises
        TransportClosed once closed."""

    @abc.abstractmethod
    async def receive(self) -> TransportEvent:
        """The next event, waiting for one; raises TransportClosed once closed."""

    @abc.abstractmethod
    def send_encoded_nowait(self, route: Route, data: bytes) -> None:
        """Send ``data``, an envelope encoded with :attr:`codec` within its
        ``max_message_size``, now; raises WouldBlock, Unroutable, TransportClosed."""

    def send_nowait(self, route: Route, envelope: Envelope) -> None:
        """:meth:`send_encoded_nowait` of ``envelope``."""
        self.send_encoded_nowait(route, self.codec.encode(envelope))

    def receive_one(self, timeout: float = 0.0) -> TransportEvent | None:
        """The next event, waiting up to ``timeout`` s for one (blocking the
        thread, :meth:`wait_readable`) when none is ready; None when none came."""
        if timeout and not self.wait_readable(timeout):
            return None
        return self.try_receive()

    def wait_readable(self, timeout: float) -> bool:
        """Block the calling thread up to ``timeout`` s for input (a synchronous
        loop's wait). Raises NotImplementedError where the transport cannot (it
        lives in an event loop: drive :meth:`try_receive` from a task instead)."""
        raise NotImplementedError(f"{type(self).__name__} cannot block a thread waiting "
                                  "for input; drive the engine from its event loop")

    def heartbeat_routes(self) -> Iterable[Route]:
        """Where this engine's heartbeats go: the clients it has heard from or dials
        (default: the one peer of a transport without routes)."""
        return (None,)

    def open(self) -> None:
        """Bind or connect for a synchronous loop; idempotent (default: nothing to open)."""
        return None

    def close(self) -> None:
        """Close with a bounded linger; idempotent; never hangs (default: nothing)."""
        return None

    async def __aenter__(self: _E) -> _E:
        """Open for an event loop (default: :meth:`open`)."""
        self.open()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def upkeep(self) -> None:
        """Periodic care, from the thread that uses the transport, about once a
        heartbeat interval (default: none needed)."""
        return None

    def start_beacon(self, interval: float, status: Callable[[], Heartbeat | None]) -> bool:
        """Send ``status()`` every ``interval`` s from a thread of the transport's own
        (heartbeats that flow while the engine's thread blocks); whether it started
        (default: no beacon, the engine sends heartbeats in-band)."""
        return False

    def peer_key(self, route: Route) -> str | None:
        """The authenticated key of ``route``'s connection (default: none known)."""
        return None

    def queued_bytes_bound(self) -> int:
        """The most bytes held for one connection, both directions (0: no bound)."""
        return 0

    # counters (0: the transport has no such thing)
    @property
    def open_connections(self) -> int:
        """Connections open now on the transport's listening sockets."""
        return 0

    @property
    def connections_refused(self) -> int:
        """Connections refused because a listening socket had its bound open."""
        return 0

    @property
    def routes_refused(self) -> int:
        """Client routes refused because the route table was full of live ones."""
        return 0

    @property
    def redials(self) -> int:
        """Times the request connection was dialed again after its socket gave up."""
        return 0

    @property
    def auth_rejections(self) -> int:
        """Client keys the transport's authenticator refused."""
        return 0

    @property
    def beacon_refusals(self) -> dict[str, int]:
        """What a beacon that binds refused: routes and frames that were no hello."""
        return {"routes": 0, "frames": 0}
