"""ZeroMQ client transports with one sending socket per engine rank.

* :class:`ZmqDealerClientTransport` — the reverse orientation (FastDeploy's):
  each engine binds a ROUTER, the client connects one DEALER per rank (and one
  per rank to the engine's liveness beacon, a ROUTER too).
* :class:`ZmqPushPullClientTransport` — separate channels: one PUSH per rank for
  requests, one bound PULL for all replies.
* :class:`ZmqPairClientTransport` — one PAIR per rank, for inproc engines in
  the same process (the engine side must use the same ``zmq.Context``).

A reader task per socket feeds one event stream that :meth:`receive` reads;
the guarantees are those of :mod:`ctlwire.transports.zmq_client` (which
re-exports these classes). Ranks come and go at run time: ``add_rank(rank,
address)`` opens and connects (or binds) the rank's socket and starts its
reader and monitor; ``remove_rank(rank)`` stops them and closes its socket
(no disconnection is reported for it); ``move_rank`` does both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

import anyio
import zmq
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ctlwire.transports.codec import Codec, check_pickle_allowed
from ctlwire.transports.curve import CurveClientConfig
from ctlwire.transports.envelope import Envelope, Heartbeat
from ctlwire.transports.errors import (
    AuthenticationFailed,
    SocketClosed,
    TransportClosed,
    Unroutable,
    WouldBlock,
)
from ctlwire.transports.event_stream import receive_event, receive_events
from ctlwire.transports.memory import decode_event
from ctlwire.transports.redial import SessionWatch
from ctlwire.transports.transport import Dropped, PeerDisconnected, Received, TransportEvent
from ctlwire.transports.zmq_client_base import _ZmqClientBase
from ctlwire.transports.zmq_config import (
    ZmqOptions,
    beacon_address_for,
    check_address,
    connect_socket,
    new_client_identity,
)
from ctlwire.transports.zmq_monitor import DOWN_EVENTS, UP_EVENTS, SocketMonitor
from ctlwire.transports.zmq_socket import AsyncZmqSocket

__all__ = [
    "ZmqDealerClientTransport",
    "ZmqPairClientTransport",
    "ZmqPushPullClientTransport",
]


class _PerRankClient(_ZmqClientBase):
    """One sending socket per rank (DEALER, PUSH or PAIR), reader tasks, monitors."""

    send_kind: int = zmq.DEALER
    bind_per_rank = False

    def __init__(self, addresses: Mapping[int, str] | Sequence[str], *, codec: Codec | None,
                 options: ZmqOptions | None, curve: CurveClientConfig | None,
                 context: zmq.Context[zmq.Socket[bytes]] | None,
                 allow_insecure_tcp: bool = False, allow_abstract_ipc: bool = False) -> None:
        super().__init__(codec=codec, options=options, context=context)
        self.addresses: dict[int, str] = (dict(addresses) if isinstance(addresses, Mapping)
                                          else dict(enumerate(addresses)))
        self.curve = curve
        self._allow_insecure_tcp = allow_insecure_tcp
        self._allow_abstract_ipc = allow_abstract_ipc
        for addr in self.addresses.values():
            self._check_address(addr)
        self._by_rank: dict[int, AsyncZmqSocket] = {}
        self._monitor_of: dict[int, SocketMonitor] = {}
        self._up: dict[int, bool] = {}
        self._auth_failed: set[int] = set()  # ranks whose CURVE server refused our key
        self.counters["redials"] = 0  # connections dialed again after libzmq gave up
        send, recv = anyio.create_memory_object_stream[TransportEvent](
            self.options.effective_rcvhwm(self.codec.max_message_size))
        self._events_in: MemoryObjectSendStream[TransportEvent] = send
        self._events_out: MemoryObjectReceiveStream[TransportEvent] = recv
        self._hello = b""

    def _check_address(self, addr: str, *, bind: bool | None = None) -> None:
        check_address(addr, curve=self.curve is not None,
                      allow_insecure_tcp=self._allow_insecure_tcp,
                      allow_abstract_ipc=self._allow_abstract_ipc,
                      bind=self.bind_per_rank if bind is None else bind)
        check_pickle_allowed(self.codec, addr, self.curve is not None)

    def _open(self) -> None:
        self._hello = self.codec.encode(Heartbeat(-1, 0, 0))
        for rank, addr in self.addresses.items():
            self._open_rank(rank, addr)

    def _open_rank(self, rank: int, addr: str) -> None:
        raw = self._socket(self.send_kind)
        if self.send_kind == zmq.DEALER:
            raw.setsockopt(zmq.IMMEDIATE, 1)
            # the engine's ROUTER routes replies, and binds operations and keys, to this
            raw.setsockopt(zmq.IDENTITY, new_client_identity())
        if self.curve is not None:
            self.curve.apply(raw, rank)
        monitor = self._monitor_of[rank] = SocketMonitor(raw)
        self._monitors.append(monitor)
        if self.bind_per_rank:
            self._bind(raw, addr)
        else:
            connect_socket(raw, addr)
        self._by_rank[rank] = self._wrap(raw)
        self._up[rank] = self.bind_per_rank and addr.startswith("inproc://")

    def _start_tasks(self, tg: TaskGroup) -> None:
        for rank in self._by_rank:
            self._start_rank(tg, rank)

    def _start_rank(self, tg: TaskGroup, rank: int) -> None:
        tg.start_soon(self._watch, rank, self._monitor_of[rank])
        if self.send_kind != zmq.PUSH:
            tg.start_soon(self._read, rank, self._by_rank[rank])

    def add_rank(self, rank: int, address: str = "") -> None:
        """Connect (or bind) ``rank``'s socket at ``address`` and start reading it.
        A rank already present at another address is moved. ValueError without an
        address (or for one the security checks refuse); TransportClosed once closed."""
        if self._closed:
            raise TransportClosed("transport is closed")
        known = self.addresses.get(rank)
        if known is not None and (not address or address == known):
            return
        if not address:
            raise ValueError(f"rank {rank}: this transport connects to each rank, and "
                             "needs its address")
        self._check_address(address)
        if known is not None:
            self.remove_rank(rank)
        self.addresses[rank] = address
        if self._tg is not None:  # open: now; not yet opened: when it opens
            self._open_rank(rank, address)
            self._start_rank(self._tg, rank)

    def move_rank(self, rank: int, address: str) -> None:
        """``rank`` is now at ``address``: close its socket and connect a new one."""
        self.add_rank(rank, address)

    def remove_rank(self, rank: int) -> None:
        """Stop reading ``rank`` and close its socket (and its monitor first)."""
        self.addresses.pop(rank, None)
        self._up.pop(rank, None)  # no disconnection is reported for a removed rank
        self._auth_failed.discard(rank)
        monitor = self._monitor_of.pop(rank, None)
        if monitor is not None:
            monitor.close()
            self._monitors.remove(monitor)
        sock = self._by_rank.pop(rank, None)
        if sock is not None:
            sock.close(self.options.linger_ms)
            self._sockets.remove(sock)
            self._raw = [raw for raw in self._raw if not raw.closed]

    async def _read(self, rank: int | None, sock: AsyncZmqSocket) -> None:
        while True:
            try:
                msg = await sock.recv_multipart()
            except SocketClosed:
                return
            self.counters["received"] += 1
            if len(msg) != 1:
                event: TransportEvent = Dropped("framing", f"expected 1 frame, got {len(msg)}",
                                                sum(len(f) for f in msg), rank)
            else:
                event = decode_event(self.codec, msg[0], rank, rank)
                if rank is None:
                    event = self._check_claimed_rank(event)
                event = self._versioned(event)
            try:
                await self._events_in.send(event)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return

    async def _watch(self, rank: int, monitor: SocketMonitor) -> None:
        session = SessionWatch()
        async for event, _value, _endpoint in monitor.events():
            session.note(event, anyio.current_time())
            if event & zmq.EVENT_DISCONNECTED and not self.bind_per_rank and self._tg is not None:
                self._tg.start_soon(self._redial_if_given_up, rank, session)
            if event & UP_EVENTS:
                if event & zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self._auth_failed.discard(rank)
                if not self._up.get(rank):
                    self._up[rank] = True
                    # announce ourselves so an engine that binds learns our route
                    with contextlib.suppress(zmq.ZMQError, SocketClosed):
                        self._by_rank[rank].send_multipart_nowait([self._hello])
            elif event & zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self._auth_failed.add(rank)
            elif event & DOWN_EVENTS and self._up.get(rank):
                self._up[rank] = False
                try:
                    await self._events_in.send(PeerDisconnected(rank, "connection closed"))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return

    async def _redial_if_given_up(self, rank: int, session: SessionWatch) -> None:
        """Dial ``rank`` again if its connection, which just ended, is not redialed by
        libzmq within the grace (a protocol error: :mod:`~ctlwire.transports.redial`)."""
        await anyio.sleep(session.grace)
        sock, address = self._by_rank.get(rank), self.addresses.get(rank)
        if sock is None or address is None or not session.due(anyio.current_time()):
            return
        with contextlib.suppress(zmq.ZMQError):
            sock.socket.disconnect(address)
        with contextlib.suppress(zmq.ZMQError):
            sock.socket.connect(address)
            session.redialed()
            self.counters["redials"] += 1

    def _not_connected(self, rank: int) -> Unroutable:
        if rank in self._auth_failed:
            return AuthenticationFailed(
                rank, "CURVE authentication failed: the engine refused this client's key")
        return Unroutable(rank, "not connected")
    def _check_claimed_rank(self, event: TransportEvent) -> TransportEvent:
        """A frame from a socket that cannot tell its sender (a PULL has no identity)
        names its rank only in the envelope: a rank this transport has no address for
        is dropped and counted (``unknown_peer``), so no per-rank state can grow from
        made-up ranks."""
        if isinstance(event, Received) and event.envelope.rank not in self.addresses:
            self.counters["unknown_peer"] += 1
            return Dropped("unknown_peer", f"rank {event.envelope.rank} is not one of this "
                           "transport's ranks", event.size)
        return event

    def _sock_for(self, rank: int) -> AsyncZmqSocket:
        if self._closed:
            raise TransportClosed("transport is closed")
        sock = self._by_rank.get(rank)
        if sock is None:
            raise Unroutable(rank, "no address configured for this rank")
        if self._refused_versions:
            self._check_version(rank)
        return sock

    def send_nowait(self, rank: int, envelope: Envelope) -> None:
        self.send_encoded_nowait(rank, self._encode(envelope))

    def send_encoded_nowait(self, rank: int, data: bytes) -> None:
        sock = self._sock_for(rank)
        try:
            sock.send_multipart_nowait([data])
        except zmq.Again:
            if not self._up.get(rank):
                raise self._not_connected(rank) from None
            raise WouldBlock(f"rank {rank}: high-water mark reached") from None
        except SocketClosed:
            raise TransportClosed("transport is closed") from None
        self.counters["sent"] += 1

    async def send(self, rank: int, envelope: Envelope) -> None:
        sock = self._sock_for(rank)
        data = self._encode(envelope)
        if not self._up.get(rank):
            try:
                sock.send_multipart_nowait([data])
            except zmq.Again:
                raise self._not_connected(rank) from None
            except SocketClosed:
                raise TransportClosed("transport is closed") from None
        else:
            try:
                await sock.send_multipart([data])
            except SocketClosed:
                raise TransportClosed("transport is closed") from None
        self.counters["sent"] += 1

    async def receive(self) -> TransportEvent:
        return await receive_event(self._events_out)

    async def receive_many(self, limit: int = 64) -> list[TransportEvent]:
        """The next event (waiting for one) and those buffered behind it, up to ``limit``."""
        return await receive_events(self._events_out, limit)

    async def aclose(self) -> None:
        self._events_in.close()
        try:
            await super().aclose()
        finally:
            self._events_out.close()


class ZmqDealerClientTransport(_PerRankClient):
    """Reverse orientation: each engine binds a ROUTER at ``addresses[rank]``; the
    client connects one DEALER per rank, and one per rank to the engine's
    liveness beacon (a DEALER saying hello with every client heartbeat) at
    ``beacon_addresses[rank]`` (default
    :func:`~ctlwire.transports.zmq_config.beacon_address_for` of the rank's
    address; a rank without one relies on in-band heartbeats). ``curve`` is a
    :class:`CurveClientConfig` (the engines are the CURVE servers) naming each
    rank's own server key (:meth:`CurveClientConfig.for_ranks`; one key shared by
    several ranks needs ``any_rank=True``); tcp without it needs
    ``allow_insecure_tcp=True``, an abstract ipc name ``allow_abstract_ipc=True``."""

    send_kind = zmq.DEALER

    def __init__(self, addresses: Mapping[int, str] | Sequence[str], *,
                 codec: Codec | None = None, options: ZmqOptions | None = None,
                 curve: CurveClientConfig | None = None,
                 context: zmq.Context[zmq.Socket[bytes]] | None = None,
                 beacon_addresses: Mapping[int, str] | None = None,
                 allow_insecure_tcp: bool = False, allow_abstract_ipc: bool = False) -> None:
        super().__init__(addresses, codec=codec, options=options, curve=curve, context=context,
                         allow_insecure_tcp=allow_insecure_tcp,
                         allow_abstract_ipc=allow_abstract_ipc)
        if curve is not None:
            curve.require_rank_binding(self.addresses)
        self.beacon_addresses: dict[int, str] = {}
        for rank, address in self.addresses.items():
            beacon = (beacon_addresses or {}).get(rank) or beacon_address_for(address)
            if beacon is not None:
                self._check_address(beacon, bind=False)
                self.beacon_addresses[rank] = beacon
        self._beacons: dict[int, AsyncZmqSocket] = {}

    def _open_rank(self, rank: int, addr: str) -> None:
        super()._open_rank(rank, addr)
        address = self.beacon_addresses.get(rank)
        if address is None:
            return
        raw = self.context.socket(zmq.DEALER)
        raw.setsockopt(zmq.RCVHWM, 16)
        raw.setsockopt(zmq.SNDHWM, 4)
        raw.setsockopt(zmq.LINGER, 0)
        raw.setsockopt(zmq.MAXMSGSIZE, 4096)
        raw.setsockopt(zmq.RECONNECT_IVL, self.options.reconnect_ivl_ms)
        raw.setsockopt(zmq.RECONNECT_IVL_MAX, self.options.reconnect_ivl_max_ms)
        raw.setsockopt(zmq.IDENTITY, new_client_identity())
        if self.curve is not None:
            self.curve.apply(raw, rank)
        raw.connect(address)
        beacon = self._beacons[rank] = self._wrap(raw)
        self._say_hello(beacon)

    def _say_hello(self, beacon: AsyncZmqSocket) -> None:
        """A client heartbeat on a beacon DEALER: the engine's beacon heartbeats to
        the routes that sent one (queued until the connection is up; repeated with
        every client heartbeat to the rank, so a restarted engine learns it again)."""
        with contextlib.suppress(zmq.ZMQError, SocketClosed):
            beacon.send_multipart_nowait([self._hello])

    def send_nowait(self, rank: int, envelope: Envelope) -> None:
        if type(envelope) is Heartbeat:  # first: the request connection may be down
            beacon = self._beacons.get(rank)
            if beacon is not None:
                self._say_hello(beacon)
        super().send_nowait(rank, envelope)

    def _start_rank(self, tg: TaskGroup, rank: int) -> None:
        super()._start_rank(tg, rank)
        sock = self._beacons.get(rank)
        if sock is not None:
            tg.start_soon(self._read_beacon, rank, sock)

    def add_rank(self, rank: int, address: str = "") -> None:
        """As for every per-rank client, and the rank's beacon (at
        :func:`~ctlwire.transports.zmq_config.beacon_address_for` its address)."""
        if address and address != self.addresses.get(rank) and not self._closed:
            self._check_address(address)
            if self.curve is not None:
                self.curve.require_rank_binding([*self.addresses, rank])
            beacon = beacon_address_for(address)
            if beacon is not None:
                self._check_address(beacon, bind=False)
            if rank in self.addresses:
                self.remove_rank(rank)  # moved: a new connection and beacon
            if beacon is not None:
                self.beacon_addresses[rank] = beacon
        super().add_rank(rank, address)

    def remove_rank(self, rank: int) -> None:
        sock = self._beacons.pop(rank, None)
        self.beacon_addresses.pop(rank, None)
        if sock is not None:
            sock.close(0)
            self._sockets.remove(sock)
        super().remove_rank(rank)

    async def _read_beacon(self, rank: int, sock: AsyncZmqSocket) -> None:
        """Heartbeats of ``rank``'s beacon; anything else is dropped and counted."""
        while True:
            try:
                msg = await sock.recv_multipart()
            except SocketClosed:
                return
            event = (decode_event(self.codec, msg[0], rank, rank) if len(msg) == 1
                     else Dropped("framing", "beacon frame", sum(map(len, msg)), rank))
            if type(event) is Received and type(event.envelope) is not Heartbeat:
                event = Dropped("wrong_type", "a beacon sent something else", event.size, rank)
            try:
                await self._events_in.send(event)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return


class ZmqPairClientTransport(_PerRankClient):
    """One PAIR per rank bound at ``addresses[rank]`` (inproc); the engine's PAIR
    connects. Both ends must share ``context``."""

    send_kind = zmq.PAIR
    bind_per_rank = True

    def __init__(self, addresses: Mapping[int, str] | Sequence[str], *,
                 context: zmq.Context[zmq.Socket[bytes]], codec: Codec | None = None,
                 options: ZmqOptions | None = None, allow_insecure_tcp: bool = False,
                 allow_abstract_ipc: bool = False) -> None:
        super().__init__(addresses, codec=codec, options=options, curve=None, context=context,
                         allow_insecure_tcp=allow_insecure_tcp,
                         allow_abstract_ipc=allow_abstract_ipc)


class ZmqPushPullClientTransport(_PerRankClient):
    """Requests go out on one PUSH per rank (connected to ``request_addresses[rank]``,
    where the engine's PULL binds); replies come back on one PULL bound at
    ``reply_address`` (where every engine's PUSH connects). No CURVE: tcp needs
    ``allow_insecure_tcp=True``, an abstract ipc name ``allow_abstract_ipc=True``."""

    send_kind = zmq.PUSH

    def __init__(self, request_addresses: Mapping[int, str] | Sequence[str],
                 reply_address: str | None = None, *, codec: Codec | None = None,
                 options: ZmqOptions | None = None,
                 context: zmq.Context[zmq.Socket[bytes]] | None = None,
                 allow_insecure_tcp: bool = False, allow_abstract_ipc: bool = False) -> None:
        super().__init__(request_addresses, codec=codec, options=options, curve=None,
                         context=context, allow_insecure_tcp=allow_insecure_tcp,
                         allow_abstract_ipc=allow_abstract_ipc)
        self.reply_address = reply_address or self._private_address("replies")
        self._check_address(self.reply_address, bind=True)
        self._pull: AsyncZmqSocket | None = None

    def _open(self) -> None:
        super()._open()
        raw = self._socket(zmq.PULL)
        self.reply_address = self._bind(raw, self.reply_address)
        self._pull = self._wrap(raw)

    def _start_tasks(self, tg: TaskGroup) -> None:
        super()._start_tasks(tg)
        assert self._pull is not None
        tg.start_soon(self._read, None, self._pull)
