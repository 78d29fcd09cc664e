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

from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from types import MappingProxyType, TracebackType
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
