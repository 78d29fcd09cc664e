"""Sends that must wait: for room at a rank's high-water mark, or for its first contact.

A call hands its frames over without suspending
(:class:`~ctlwire.kernel.client.call_issuer.CallIssuer`); a frame the transport
cannot take now is handed here, with the frames after it in rank order.
:class:`WaitingSends` sends them one rank at a time:

* **Bounded.** Each wait ends by the request's deadline, and is abandoned as
  soon as the request is decided (its waiter is set) or the rank is lost
  (:meth:`WaitingSends.abandon_rank`); the other ranks are still sent to.
* **Typed.** A frame never handed over fails its rank with NotDelivered; one
  refused for authentication or protocol version with AuthenticationFailed or
  UnsupportedProtocolVersion; a closed client with ClientClosed.
* **Not handed over until sent.** A rank is reported sent to the request map once
  its frame is handed over: a loss while its send waits means NotDelivered.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import anyio

from ctlwire.kernel.client.liveness_monitor import LivenessMonitor
from ctlwire.kernel.core.request_registry import PendingRequest, RequestRegistry
from ctlwire.kernel.errors import (
    AuthenticationFailed,
    ClientClosed,
    NotDelivered,
    UnsupportedProtocolVersion,
)
from ctlwire.states import PeerState
from ctlwire.transports.envelope import Request
from ctlwire.transports.errors import AuthenticationFailed as TransportAuthFailed
from ctlwire.transports.errors import (
    ProtocolVersionRefused,
    TransportClosed,
    TransportError,
    Unroutable,
    WouldBlock,
)
from ctlwire.transports.transport import ClientTransport

__all__ = ["WaitingSends", "send_error"]


def send_error(rank: int, exc: TransportError, lost: bool) -> Exception | None:
    """The error that fails ``rank`` when the transport refused its frame with ``exc``
    (``lost``: the rank is lost), typed by what it says of delivery; None when the
    send should wait instead: for room (WouldBlock), or for the first contact of a
    rank that is not lost (Unroutable)."""
    if isinstance(exc, TransportAuthFailed):
        return AuthenticationFailed(rank, exc.detail)
    if isinstance(exc, ProtocolVersionRefused):
        return UnsupportedProtocolVersion(rank, exc.detail)
    if isinstance(exc, Unroutable):
        return NotDelivered(rank, exc.detail or "unroutable") if lost else None
    if isinstance(exc, WouldBlock):
        return None
    if isinstance(exc, TransportClosed):
        return ClientClosed(str(exc))
    return NotDelivered(rank, repr(exc))


class _AbandoningWaiter:
    """The waiter of a request while one of its sends waits: the request's decision
    abandons that send, then wakes whoever waits on the request's own waiter."""

    __slots__ = ("inner", "scope")

    def __init__(self, scope: anyio.CancelScope, inner: Any) -> None:
        self.scope = scope
        self.inner = inner

    def set(self) -> None:
        self.scope.cancel()
        if self.inner is not None:
            self.inner.set()

    def wait(self) -> Any:
        return self.inner.wait()


class WaitingSends:
    """The sends of one client that wait; see the module docstring. ``now`` is the
    client's clock; ``retry`` paces the re-tries of a send to a rank never heard from."""

    def __init__(self, transport: ClientTransport, registry: RequestRegistry,
                 liveness: LivenessMonitor, closed: Callable[[], bool],
                 now: Callable[[], float], retry: float) -> None:
        self.transport = transport
        self.registry = registry
        self.liveness = liveness
        self.peers = liveness.peers
        self.retry = retry
        self._closed = closed
        self._now = now
        #: request id -> (the scope of a send waiting for room or first contact, its
        #: rank); empty while no send waits
        self.blocked: dict[int, tuple[anyio.CancelScope, int]] = {}

    def abandon_rank(self, rank: int) -> None:
        """``rank`` is lost: sends waiting at it give up."""
        for scope, blocked_rank in list(self.blocked.values()):
            if blocked_rank == rank:
                scope.cancel()

    async def send(self, entry: PendingRequest, waiting: list[tuple[int, Request]]) -> None:
        """The frames the caller could not hand over at once, one rank at a time, in
        order: wait for room (high-water mark) or first contact, within the deadline."""
        for rank, env in waiting:
            if not entry.is_open:
                break
            error = await self._send_one(entry, rank, env)
            if error is not None and self.registry.rank_failed(entry, rank, error):
                entry.wake()
            if entry.is_open and entry.deadline is not None and self._now() >= entry.deadline:
                break  # the deadline passed while a send waited: the request expires

    async def _send_one(self, entry: PendingRequest, rank: int, env: Request
                        ) -> Exception | None:
        """Hand ``rank``'s frame over (reported sent to the request map), waiting for
        room or first contact, bounded by the request's deadline and abandoned as soon
        as the request is decided or the rank lost; the error that fails ``rank``
        (None: handed over, or abandoned)."""
        try:
            self.transport.send_nowait(rank, env)
        except TransportError as exc:
            error = send_error(rank, exc, self.peers.state(rank) is PeerState.LOST)
            if error is not None:
                return error
            full = isinstance(exc, WouldBlock)
            scope = anyio.CancelScope(deadline=entry.deadline or math.inf)
            self.blocked[entry.id] = (scope, rank)
            waiter = entry.waiter
            entry.waiter = _AbandoningWaiter(scope, waiter)  # a decision abandons the send
            try:
                with scope:
                    await (self.transport.send(rank, env) if full
                           else self._send_after_first_contact(rank, env))
                    self.registry.sent(entry, rank)
                    return None
            except TransportError as refused:  # refused while it waited: no more waiting
                return send_error(rank, refused, lost=True)
            finally:
                entry.waiter = waiter
                self.blocked.pop(entry.id, None)
            if full or self.peers.state(rank) is PeerState.LOST:
                return None  # abandoned
            return NotDelivered(rank, (
                "never heard from within the deadline"
                if self.peers.state(rank) is PeerState.UNKNOWN
                else "request connection not up within the deadline"))
        self.registry.sent(entry, rank)
        return None

    async def _send_after_first_contact(self, rank: int, env: Request) -> None:
        """``rank`` refused the frame because it has never been heard from (or its
        request connection is not up): send it once it is, trying again on every
        change of a peer and every ``retry`` s (a connection may come up, or its
        handshake fail, without the rank being heard from). Raises TransportClosed
        once the client closed, and Unroutable when the rank is lost or refuses
        the frame for its key or protocol version."""
        while True:
            changed = self.liveness.peer_changed
            if self._closed():
                raise TransportClosed("client is closed")
            try:
                self.transport.send_nowait(rank, env)
                return
            except WouldBlock:
                await self.transport.send(rank, env)
                return
            except Unroutable as exc:
                if send_error(rank, exc, self.peers.state(rank) is PeerState.LOST):
                    raise
            with anyio.move_on_after(self.retry):
                await changed.wait()
