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

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from types import MappingProxyType, TracebackType
from typing import Any, TypeVar

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


class ClientTransport(ABC):
    """API-server side: one socket (or one per rank) to all engine ranks.

    Use as an async context manager: entering binds or connects, exiting
    closes without hanging (bounded linger). A transport subclasses this class
    and implements its abstract methods; every other method has a default built
    on them, which a transport overrides when it can do better:

    * :meth:`receive_many`: :meth:`receive`, one event a call;
    * :meth:`send_encoded_nowait`: the bytes decoded, then :meth:`send_nowait`;
    * :meth:`batched_sends`: a block that does nothing more;
    * :meth:`add_rank`, :meth:`move_rank`, :meth:`remove_rank`: nothing (routes
      are learned from the peers' frames);
    * :attr:`counters`, :attr:`auth_failures`, :attr:`auth_rejections`: none.

    A wrapper that forwards other attributes to the transport it wraps is never
    bypassed: the defaults are found on its own class and call its own methods.
    """

    codec: Codec
    #: the transport's own counters (frames sent, received, dropped, ...), for metrics
    counters: Mapping[str, int] = MappingProxyType({})

    @abstractmethod
    async def __aenter__(self) -> ClientTransport: ...

    @abstractmethod
    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None: ...

    @abstractmethod
    def send_nowait(self, rank: int, envelope: Envelope) -> None:
        """Send to ``rank`` now; raises Unroutable, WouldBlock, TransportClosed."""

    @abstractmethod
    async def send(self, rank: int, envelope: Envelope) -> None:
        """Send to ``rank``, waiting for room; raises Unroutable, TransportClosed."""

    @abstractmethod
    async def receive(self) -> TransportEvent:
        """The next event; raises TransportClosed once closed."""

    async def receive_many(self, limit: int = 64) -> list[TransportEvent]:
        """The next event (waiting for one) and up to ``limit - 1`` queued behind it,
        in order; raises TransportClosed once closed."""
        return [await self.receive()]

    def send_encoded_nowait(self, rank: int, data: bytes) -> None:
        """:meth:`send_nowait` of an envelope already encoded with :attr:`codec` (no
        longer than its ``max_message_size``: the caller checks); the same errors."""
        self.send_nowait(rank, self.codec.decode(data))

    def batched_sends(self) -> AbstractContextManager[None]:
        """A block of sends that does not suspend (a fan-out's, a heartbeat tick's),
        which the transport may complete together."""
        return nullcontext()

    def add_rank(self, rank: int, address: str = "") -> None:
        """``rank`` joined the client's membership, at ``address`` (a transport that
        connects to each rank raises ValueError without one)."""
        return None

    def move_rank(self, rank: int, address: str) -> None:
        """``rank`` is now at ``address``."""
        return None

    def remove_rank(self, rank: int) -> None:
        """``rank`` left the client's membership: its route or connection goes."""
        return None

    @property
    def auth_failures(self) -> int:
        """CURVE handshakes lost because a peer refused this side's key."""
        return 0

    @property
    def auth_rejections(self) -> int:
        """CURVE handshakes this side refused (a key not allow-listed)."""
        return 0


_E = TypeVar("_E", bound="EngineTransport")


class EngineTransport(ABC):
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

    @abstractmethod
    def try_receive(self) -> TransportEvent | None:
        """The next event if one is ready, else None. Never blocks; raises
        TransportClosed once closed."""

    @abstractmethod
    async def receive(self) -> TransportEvent:
        """The next event, waiting for one; raises TransportClosed once closed."""

    @abstractmethod
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
