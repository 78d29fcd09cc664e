"""ZeroMQ client (API-server side) transports on anyio, for asyncio and trio.

* :class:`ZmqRouterClientTransport` — the default: the client binds one ROUTER;
  each engine rank connects a DEALER whose identity names its rank. One socket
  fans out to N ranks. ``ROUTER_MANDATORY``: sending to a rank that is not
  connected raises :class:`~ctlwire.transports.errors.Unroutable`.
* :class:`ZmqDealerClientTransport` — the reverse orientation (FastDeploy's):
  each engine binds a ROUTER, the client connects one DEALER per rank.
* :class:`ZmqPushPullClientTransport` — separate channels: one PUSH per rank for
  requests, one bound PULL for all replies.
* :class:`ZmqPairClientTransport` — one PAIR per rank, for inproc engines in
  the same process (the engine side must use the same ``zmq.Context``).

All of them: one task receives from each socket (the caller of
:meth:`receive`, or a reader task per socket when there are several), sends
come from the client's tasks in the same thread and never block the event
loop, frames from an identity that is not a rank are dropped and counted, a
malformed or oversized frame is reported as ``Dropped`` and never ends the
receive loop, socket monitors report disconnections as ``PeerDisconnected``,
and closing never hangs (monitors first, then sockets with a bounded linger,
then the authenticator and the context this transport created).

The ROUTER client lives here; the per-rank clients (DEALER, PUSH/PULL, PAIR)
in :mod:`ctlwire.transports.zmq_per_rank_client` and what all share in
:mod:`ctlwire.transports.zmq_client_base`; this module re-exports them all.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import zmq
from anyio.abc import TaskGroup

from ctlwire.transports.codec import Codec, check_pickle_allowed
from ctlwire.transports.connection_guard import ConnectionBound
from ctlwire.transports.curve import CurveAuthenticator, CurveServerConfig
from ctlwire.transports.envelope import Envelope, Heartbeat
from ctlwire.transports.errors import (
    SocketClosed,
    TransportClosed,
    TransportError,
    Unroutable,
    WouldBlock,
)
from ctlwire.transports.group_beacon import GroupBeaconReader, request_route_in_group
from ctlwire.transports.memory import decode_event
from ctlwire.transports.transport import Dropped, PeerDisconnected, Received, TransportEvent
from ctlwire.transports.zmq_client_base import _ZmqClientBase
from ctlwire.transports.zmq_config import (
    ZmqOptions,
    check_bind_address,
    rank_from_beacon_identity,
    rank_from_identity,
    rank_identity,
    request_route_of_beacon,
)
from ctlwire.transports.zmq_monitor import DOWN_EVENTS, SocketMonitor
from ctlwire.transports.zmq_per_rank_client import (
    ZmqDealerClientTransport,
    ZmqPairClientTransport,
    ZmqPushPullClientTransport,
)
from ctlwire.transports.zmq_socket import AsyncZmqSocket

__all__ = [
    "ZmqDealerClientTransport",
    "ZmqPairClientTransport",
    "ZmqPushPullClientTransport",
    "ZmqRouterClientTransport",
]

log = logging.getLogger("ctlwire.zmq")
_PROBE_DELAYS = (0.0, 0.005, 0.02, 0.1, 0.5)
#: Bound of the per-transport identity caches (peers choose identities).
_CACHE_LIMIT = 4096


#: the monitor events a connection bound is kept from (their value is the descriptor)
_BOUND_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED

#: events taken without suspending before one checkpoint: a flood cannot starve the loop
_FAIRNESS_BUDGET = 64


class ZmqRouterClientTransport(_ZmqClientBase):
    """The client binds a ROUTER at ``address``; engine ranks connect DEALERs.

    ``address`` defaults to a fresh ipc path in a private directory
    (``self.address`` tells it). A tcp bind needs ``curve`` (a
    :class:`CurveServerConfig` binding each rank to its engine's key with
    ``ranks=``, or saying ``any_rank=True``) or an explicit
    ``allow_insecure_tcp=True`` (:class:`~ctlwire.transports.zmq_config.InsecureBind`
    otherwise, loopback included); an abstract ipc name (``ipc://@name``) without
    CURVE needs ``allow_abstract_ipc=True``
    (:class:`~ctlwire.transports.zmq_config.InsecureAbstractIpc`). Pickle is refused
    on tcp without CURVE and on abstract names.

    Routes under CURVE: rank N's requests go to the identity (``rank-N.TAG``, see
    :class:`~ctlwire.transports.zmq_engine.ZmqDealerEngineTransport`) whose frames
    were last heard for rank N; with ``ranks=``, only frames authenticated with rank
    N's key teach it, and until one has, sending to rank N is
    :class:`~ctlwire.transports.errors.Unroutable`. A holder of another rank's key
    connecting as ``rank-N`` (libzmq's ZAP request does not carry the identity a
    peer asks for, so the handshake cannot refuse it) has its frames dropped and
    counted (``impersonation``) and never receives rank N's requests.
    ``max_connections``: at most this many connections stay open on the ROUTER
    (each engine rank holds two: requests and beacon), newer ones refused and
    counted (:attr:`connections_refused`, see
    :class:`~ctlwire.transports.connection_guard.ConnectionBound`); None: no bound.
    """

    def __init__(self, address: str | None = None, *, codec: Codec | None = None,
                 options: ZmqOptions | None = None, curve: CurveServerConfig | None = None,
                 context: zmq.Context[zmq.Socket[bytes]] | None = None,
                 allow_insecure_tcp: bool = False, max_connections: int | None = None,
                 allow_abstract_ipc: bool = False) -> None:
        super().__init__(codec=codec, options=options, context=context)
        self._connections = (ConnectionBound(max_connections)
                             if max_connections is not None else None)
        self.address = address or self._private_address("control")
        self.curve = curve
        if curve is not None:
            curve.require_rank_binding()
        check_bind_address(self.address, curve=curve is not None,
                           allow_insecure_tcp=allow_insecure_tcp,
                           allow_abstract_ipc=allow_abstract_ipc)
        check_pickle_allowed(self.codec, self.address, curve is not None)
        self._sock: AsyncZmqSocket | None = None
        self._pending: deque[TransportEvent] = deque()
        self._receive_waits = False  # a receive waits in sock.wait_readable()
        self._woken = False  # _wake_receiver() was called since the last receive took it
        self._streak = 0  # events taken in a row without suspending (fairness)
        # the last receive found the queue empty: the next one waits at once (the wait
        # reads EVENTS first) instead of asking libzmq again for a zmq.Again
        self._drained = False
        self._known: set[int] = set()
        self._probe_hb = b""
        # hot path caches, bounded: rank -> identity (sends), identity -> rank (replies).
        # Under CURVE the identity a rank's requests go to is learned from the frames
        # of that rank (``rank-N.TAG``); with ranks bound to keys only from frames
        # authenticated with the rank's key, and there is no default route.
        self._identity_of: dict[int, bytes] = {}
        self._learned_routes_only = curve is not None and curve.binds_ranks
        self._rank_of: dict[bytes, int] = {}
        # beacon identity -> rank: an identity is parsed once per connection, not per heartbeat
        self._beacon_rank_of: dict[bytes, int] = {}
        self._groups = GroupBeaconReader(self.codec, self.counters)
        self._fast_decode = self.codec.fast_envelope_decoder()

    def _open(self) -> None:
        raw = self._socket(zmq.ROUTER)
        if self.curve is not None:
            self._auth = CurveAuthenticator(self.context, self.curve)
            self._auth.start()
            self.curve.apply(raw)
        self._sock = self._wrap(raw)
        if self.curve is not None and self.curve.binds_ranks:
            self._sock.track_user_id()
        self._monitors.append(SocketMonitor(raw))
        self.address = self._bind(raw, self.address)
        self._probe_hb = self.codec.encode(Heartbeat(-1, 0, 0))

    def _start_tasks(self, tg: TaskGroup) -> None:
        tg.start_soon(self._watch_disconnects, name="ctlwire.zmq.router.monitor")

    @property
    def auth_rejections(self) -> int:
        return self._auth.rejected if self._auth is not None else 0

    def _frames(self, rank: int, envelope: Envelope) -> list[bytes]:
        identity = self._identity_of.get(rank)
        if identity is None:
            identity = self._default_route(rank)
        return [identity, self._encode(envelope)]

    def _default_route(self, rank: int) -> bytes:
        """The identity of ``rank`` before any was learned: ``rank-N``; none when ranks
        are bound to keys (a route is only ever one authenticated for the rank)."""
        if self._refused_versions:
            self._check_version(rank)
        if self._learned_routes_only:
            raise Unroutable(rank, "no connection authenticated with this rank's key yet")
        identity = rank_identity(rank)
        if len(self._identity_of) < _CACHE_LIMIT:
            self._identity_of[rank] = identity
        return identity

    def _learn_route(self, rank: int, route: bytes) -> None:
        """Frames of ``rank`` (authenticated for it, when ranks are bound to keys) came
        from the connection ``route``: its requests go there from now on."""
        known = self._identity_of.get(rank)
        if known != route and (known is not None or len(self._identity_of) < _CACHE_LIMIT):
            self._identity_of[rank] = route

    def add_rank(self, rank: int, address: str = "") -> None:
        """A rank joined the client's membership: nothing to connect (engines
        connect to this ROUTER; ``address`` is not used), its route is learned
        from its frames as for any rank."""

    def remove_rank(self, rank: int) -> None:
        """A rank left the client's membership: forget its route (a rank added
        again learns it afresh from its frames)."""
        self._identity_of.pop(rank, None)
        self._known.discard(rank)
        for cache in (self._rank_of, self._beacon_rank_of):
            for identity in [i for i, r in cache.items() if r == rank]:
                del cache[identity]

    def batched_sends(self) -> contextlib.AbstractContextManager[None]:
        """Sends inside the block (a fan-out's :meth:`send_nowait` to many ranks)
        re-check the socket's readiness once, at the end, instead of once per send
        (:meth:`AsyncZmqSocket.batched_sends`). The block must not suspend."""
        sock = self._sock
        if sock is None or self._closed:
            return contextlib.nullcontext()
        return sock.batched_sends()

    def send_encoded_nowait(self, rank: int, data: bytes) -> None:
        """:meth:`send_nowait` of an envelope already encoded by :attr:`codec` (no
        longer than its ``max_message_size``: the caller checks): for a fan-out's
        per-rank sends, with no envelope object, no encode and no frame list."""
        sock = self._sock
        if sock is None or self._closed:
            raise TransportClosed("transport is not open")
        identity = self._identity_of.get(rank)
        if identity is None:
            identity = self._default_route(rank)
        try:
            sock.send_pair_nowait(identity, data)
        except zmq.Again:
            raise WouldBlock(f"rank {rank}: high-water mark reached") from None
        except zmq.ZMQError as exc:
            raise self._send_error(rank, exc) from None
        except SocketClosed:
            raise TransportClosed("transport is closed") from None
        self.counters["sent"] += 1

    def send_nowait(self, rank: int, envelope: Envelope) -> None:
        self.send_encoded_nowait(rank, self._encode(envelope))

    async def send(self, rank: int, envelope: Envelope) -> None:
        sock = self._sock
        if sock is None or self._closed:
            raise TransportClosed("transport is not open")
        frames = self._frames(rank, envelope)
        try:
            await sock.send_multipart(frames)
        except zmq.ZMQError as exc:
            raise self._send_error(rank, exc) from None
        except SocketClosed:
            raise TransportClosed("transport is closed") from None
        self.counters["sent"] += 1

    def _send_error(self, rank: int, exc: zmq.ZMQError) -> TransportError:
        if exc.errno == zmq.EHOSTUNREACH:
            self._known.discard(rank)
            return Unroutable(rank, "no engine connected with this rank's identity")
        return TransportError(f"rank {rank}: {exc}")

    async def receive(self) -> TransportEvent:
        """The next event: a disconnection found by the probe, else the next message,
        decoded. Yields once every 64 events taken without suspending."""
        return (await self.receive_many(1))[0]

    async def receive_many(self, limit: int = _FAIRNESS_BUDGET) -> list[TransportEvent]:
        """The next event (waiting for one) and those queued behind it, up to ``limit``,
        in order: one call per wake-up of a receive loop rather than one per event."""
        event = await self._next()
        while event is None:  # woken with nothing to hand on: wait again
            event = await self._next()
        events = [event]
        pending = self._pending
        while pending and len(events) < limit:
            events.append(pending.popleft())
        sock = self._sock
        if sock is None or len(events) >= limit:
            return events
        try:
            msgs = sock.recv_many_nowait(limit - len(events))
        except SocketClosed:
            return events  # the next call raises TransportClosed
        if len(msgs) < limit - len(events):
            self._drained = True
        to_event, append = self._event, events.append
        for msg in msgs:
            append(to_event(msg))
            if pending:  # a group beacon's other heartbeats: next, in order
                events.extend(pending)
                pending.clear()
        return events

    async def _next(self) -> TransportEvent | None:
        """The next event, or None when :meth:`_wake_receiver` ended the wait for it."""
        sock = self._sock
        if sock is None:
            raise TransportClosed("transport is not open")
        self._streak += 1
        if self._streak >= _FAIRNESS_BUDGET:
            self._streak = 0
            await anyio.lowlevel.checkpoint()
        if self._pending:
            return self._pending.popleft()
        try:
            msg = None if self._drained else sock.recv_multipart_nowait()
            self._drained = False
            while msg is None and not self._woken:
                self._streak = 0
                self._receive_waits = True
                try:
                    await sock.wait_readable()
                finally:
                    self._receive_waits = False
                if not self._woken:
                    msg = sock.recv_multipart_nowait()
        except SocketClosed:
            raise TransportClosed("transport is closed") from None
        if msg is None:  # woken by _wake_receiver(): nothing was taken
            self._woken = False
            return self._pending.popleft() if self._pending else None
        return self._event(msg)

    def _wake_receiver(self) -> None:
        """End the wait of a receive in progress (or the next one's, before it waits)."""
        self._woken = True
        if self._receive_waits and self._sock is not None:
            self._sock.interrupt_wait()

    def _event(self, msg: list[bytes]) -> TransportEvent:
        self.counters["received"] += 1
        if len(msg) != 2:
            if len(msg) > 2 and GroupBeaconReader.speaks(msg[0]):
                return self._group_event(msg)
            return Dropped("framing", f"expected 2 frames, got {len(msg)}",
                           sum(len(f) for f in msg))
        identity, data = msg
        fast = self._fast_decode
        size = len(data)
        if self.curve is None and fast is not None and size <= self.codec.max_message_size:
            # an identity seen before, no key binding to check: one lookup, one decode
            # (a rank's request connection first: replies outnumber beacon heartbeats)
            named = self._rank_of.get(identity)
            if named is not None:
                self._known.add(named)
                try:
                    env = fast(data)
                except Exception:
                    pass  # not an envelope: decode_event gives the verdict
                else:
                    if type(env) is Heartbeat:
                        return self._versioned(Received(env, named, identity, size))
                    return Received(env, named, identity, size)
            else:
                beat = self._beacon_rank_of.get(identity)
                if beat is not None:
                    try:
                        env = fast(data)
                    except Exception:
                        pass  # not an envelope: the general path gives the verdict
                    else:
                        if type(env) is Heartbeat:
                            return self._versioned(Received(env, beat, identity, size))
        named = self._rank_of.get(identity)
        if named is None:
            named = rank_from_identity(identity)
            if named is not None and len(self._rank_of) < _CACHE_LIMIT:
                self._rank_of[identity] = named
        beacon = named is None
        if named is None:
            named = self._beacon_rank_of.get(identity)
            if named is None:
                named = rank_from_beacon_identity(identity)
                if named is None:
                    if GroupBeaconReader.speaks(identity):
                        return self._group_event(msg)
                    self.counters["unknown_peer"] += 1
                    return Dropped("unknown_peer", f"identity {identity[:32]!r} is not a rank",
                                   len(data))
                if len(self._beacon_rank_of) < _CACHE_LIMIT:
                    self._beacon_rank_of[identity] = named
        rank: int = named
        curve = self.curve
        if curve is not None and curve.rank_keys:
            user = self._sock.last_user_id if self._sock is not None else None
            if user is None or user not in curve.keys_for_rank(rank):
                # a key that is not this rank's speaks under its identity: never believed
                self.counters["impersonation"] = self.counters.get("impersonation", 0) + 1
                return Dropped("impersonation",
                               f"identity {identity[:32]!r} sent by a key not bound to rank "
                               f"{rank}", len(data), None)
        if beacon:
            event = decode_event(self.codec, data, rank, identity)
            if type(event) is Received and type(event.envelope) is not Heartbeat:
                # a beacon carries heartbeats only
                self.counters["unknown_peer"] += 1
                return Dropped("wrong_type", "a beacon sent something else", len(data), rank)
            event = self._versioned(event)
            if curve is not None and type(event) is Received:
                self._learn_route(rank, request_route_of_beacon(identity))
            return event
        self._known.add(rank)
        event = self._versioned(decode_event(self.codec, data, rank, identity))
        if curve is not None and type(event) is Received:
            self._learn_route(rank, identity)
        return event

    def _group_event(self, msg: list[bytes]) -> TransportEvent:
        """A group beacon's message: an event per heartbeat, in order
        (:class:`~ctlwire.transports.group_beacon.GroupBeaconReader`), the first
        returned and the rest queued next."""
        curve = self.curve
        bound: Callable[[int], bool] | None = None
        if curve is not None and curve.rank_keys:
            user = self._sock.last_user_id if self._sock is not None else None

            def bound(rank: int) -> bool:  # the sender's key is bound to the rank
                return user is not None and user in curve.keys_for_rank(rank)
        events, tag = self._groups.events(msg, bound)
        for i, event in enumerate(events):
            if type(event) is Received and event.peer is not None:
                events[i] = event = self._versioned(event)
                if curve is not None and type(event) is Received and event.peer is not None:
                    self._learn_route(event.peer, request_route_in_group(event.peer, tag))
        self._pending.extend(events[1:])
        return events[0]

    def _versioned(self, event: TransportEvent) -> TransportEvent:
        event = super()._versioned(event)
        if type(event) is Dropped and event.reason == "protocol_version" and event.peer is not None:
            self._identity_of.pop(event.peer, None)  # no route to it while refused
        return event

    def _push(self, event: TransportEvent) -> None:
        self._pending.append(event)
        self._wake_receiver()  # a receive in progress returns to pick the event up

    @property
    def connections_refused(self) -> int:
        """Connections refused because ``max_connections`` were open."""
        return self._connections.refused if self._connections is not None else 0

    async def _watch_disconnects(self) -> None:
        monitor = self._monitors[0]
        bound = self._connections
        async for event, value, endpoint in monitor.events():
            if bound is not None and event & _BOUND_EVENTS:
                bound.note(event, value, endpoint)
                bound.refuse_excess()
            if event & DOWN_EVENTS and self._known:
                self._tg_start(self._probe)

    def _tg_start(self, fn: Any) -> None:
        if self._tg is not None:
            self._tg.start_soon(fn)

    async def _probe(self) -> None:
        """After a disconnection: find which known ranks became unroutable."""
        sock = self._sock
        for delay in _PROBE_DELAYS:
            if delay:
                await anyio.sleep(delay)
            if sock is None or self._closed:
                return
            for rank in sorted(self._known):
                route = self._identity_of.get(rank)
                if route is None:
                    if self._learned_routes_only:
                        continue
                    route = rank_identity(rank)
                try:
                    sock.send_multipart_nowait([route, self._probe_hb])
                except zmq.ZMQError as exc:
                    if exc.errno == zmq.EHOSTUNREACH:
                        self._known.discard(rank)
                        self._push(PeerDisconnected(rank, "connection closed"))
                except SocketClosed:
                    return
