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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from functools import partial
from types import TracebackType
from typing import Any, cast

import anyio
import anyio.lowlevel
import zmq
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ctlwire.transports.codec import Codec, MsgpackCodec, check_pickle_allowed
from ctlwire.transports.curve import (
    CurveAuthenticator,
    CurveClientConfig,
    CurveServerConfig,
)
from ctlwire.transports.envelope import Envelope, Heartbeat
from ctlwire.transports.errors import (
    AuthenticationFailed,
    SocketClosed,
    TransportClosed,
    TransportError,
    Unroutable,
    WouldBlock,
)
from ctlwire.transports.memory import decode_event
from ctlwire.transports.transport import Dropped, PeerDisconnected, Received, TransportEvent
from ctlwire.transports.zmq_config import (
    ZmqOptions,
    beacon_address_for,
    bind_socket,
    check_bind_address,
    connect_socket,
    private_ipc_address,
    rank_from_beacon_identity,
    rank_from_identity,
    rank_identity,
    remove_ipc_file,
)
from ctlwire.transports.zmq_monitor import DOWN_EVENTS, UP_EVENTS, SocketMonitor
from ctlwire.transports.zmq_socket import AsyncZmqSocket, ReceiveInterrupted

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


def _fast_checkpoint() -> Callable[[], Awaitable[None]]:
    """``anyio.lowlevel.checkpoint`` of the running backend, without the lookup of
    the backend that anyio makes on every call (which costs more than the
    checkpoint itself). Both are cancellation points and yield to the loop."""
    try:
        import sniffio

        library = sniffio.current_async_library()
    except Exception:  # pragma: no cover - no sniffio, or not in a loop
        return anyio.lowlevel.checkpoint
    if library == "asyncio":
        return partial(asyncio.sleep, 0)
    if library == "trio":
        import trio

        return cast(Callable[[], Awaitable[None]], trio.lowlevel.checkpoint)
    return anyio.lowlevel.checkpoint  # pragma: no cover


class _ZmqClientBase:
    """Context, options, CURVE, monitors and orderly close, shared by the clients."""

    def __init__(self, *, codec: Codec | None, options: ZmqOptions | None,
                 context: zmq.Context[zmq.Socket[bytes]] | None) -> None:
        self.codec = codec or MsgpackCodec()
        self.options = options or ZmqOptions()
        self._own_context = context is None
        self.context: zmq.Context[zmq.Socket[bytes]] = context or zmq.Context()
        self._sockets: list[AsyncZmqSocket] = []
        self._raw: list[zmq.Socket[bytes]] = []  # every socket made, closed on close
        self._monitors: list[SocketMonitor] = []
        self._auth: CurveAuthenticator | None = None
        self._tg: TaskGroup | None = None
        self._closed = False
        self._opened = False
        self._bound_ipc: list[tuple[str, bool]] = []  # (address, in a private dir we made)
        self.counters: dict[str, int] = {"sent": 0, "received": 0, "unknown_peer": 0}
        self._checkpoint: Callable[[], Awaitable[None]] = anyio.lowlevel.checkpoint

    def _socket(self, kind: int) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = self.context.socket(kind)
        self._raw.append(sock)
        self.options.apply(sock, self.codec.max_message_size)
        return sock

    def _wrap(self, sock: zmq.Socket[bytes]) -> AsyncZmqSocket:
        wrapped = AsyncZmqSocket(sock)
        self._sockets.append(wrapped)
        return wrapped

    def _open(self) -> None:
        raise NotImplementedError

    def _start_tasks(self, tg: TaskGroup) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Any:
        if self._opened:
            raise RuntimeError("a transport can be opened once")
        self._opened = True
        self._checkpoint = _fast_checkpoint()
        try:
            self._open()
        except BaseException:
            self._close_sync()
            raise
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        self._start_tasks(tg)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    @property
    def auth_failures(self) -> int:
        """CURVE handshakes this side lost: a peer refused our key (monitor events)."""
        return sum(m.auth_failures for m in self._monitors)

    async def aclose(self) -> None:
        tg, self._tg = self._tg, None
        if tg is not None:
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)
        self._close_sync()

    def _close_sync(self) -> None:
        if self._closed:
            return
        self._closed = True
        for mon in self._monitors:
            mon.close()
        for sock in self._sockets:
            sock.close(self.options.linger_ms)
        for raw in self._raw:  # one a failed bind/connect left unwrapped
            if not raw.closed:
                raw.close(self.options.linger_ms)
        if self._auth is not None:
            self._auth.stop()
        if self._own_context:
            self.context.term()
        for address, private in self._bound_ipc:
            remove_ipc_file(address, private_dir=private)

    def _private_address(self, name: str) -> str:
        """A fresh ipc address in a private directory, removed when this transport
        closes, or when it is garbage-collected without ever being opened."""
        address = private_ipc_address(name)
        weakref.finalize(self, remove_ipc_file, address, private_dir=True)
        return address

    def _bind(self, raw: zmq.Socket[bytes], address: str, private: bool = False) -> str:
        address = bind_socket(raw, address)
        if address.startswith("ipc://"):
            self._bound_ipc.append((address, private))
        return address

    @property
    def closed(self) -> bool:
        return self._closed

    def _encode(self, envelope: Envelope) -> bytes:
        if self._closed:
            raise TransportClosed("transport is closed")
        return self.codec.encode(envelope)


class ZmqRouterClientTransport(_ZmqClientBase):
    """The client binds a ROUTER at ``address``; engine ranks connect DEALERs.

    ``address`` defaults to a fresh ipc path in a private directory
    (``self.address`` tells it). tcp binds must be loopback unless ``curve``
    (a :class:`CurveServerConfig` whose allow-list names the engines' keys) is
    given or ``allow_insecure_tcp`` is set. Pickle is refused on tcp without CURVE.
    """

    def __init__(self, address: str | None = None, *, codec: Codec | None = None,
                 options: ZmqOptions | None = None, curve: CurveServerConfig | None = None,
                 context: zmq.Context[zmq.Socket[bytes]] | None = None,
                 allow_insecure_tcp: bool = False) -> None:
        super().__init__(codec=codec, options=options, context=context)
        self._private = address is None
        self.address = address or self._private_address("control")
        self.curve = curve
        check_bind_address(self.address, curve=curve is not None,
                           allow_insecure_tcp=allow_insecure_tcp)
        check_pickle_allowed(self.codec, self.address, curve is not None)
        self._sock: AsyncZmqSocket | None = None
        self._pending: deque[TransportEvent] = deque()
        self._known: set[int] = set()
        self._probe_hb = b""
        # hot path caches, bounded: rank -> identity (sends), identity -> rank (replies)
        self._identity_of: dict[int, bytes] = {}
        self._rank_of: dict[bytes, int] = {}
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
        self.address = self._bind(raw, self.address, self._private)
        self._probe_hb = self.codec.encode(Heartbeat(-1, 0, 0))

    def _start_tasks(self, tg: TaskGroup) -> None:
        tg.start_soon(self._watch_disconnects, name="ctlwire.zmq.router.monitor")

    @property
    def auth_rejections(self) -> int:
        return self._auth.rejected if self._auth is not None else 0

    def _frames(self, rank: int, envelope: Envelope) -> list[bytes]:
        identity = self._identity_of.get(rank)
        if identity is None:
            identity = rank_identity(rank)
            if len(self._identity_of) < _CACHE_LIMIT:
                self._identity_of[rank] = identity
        return [identity, self._encode(envelope)]

    @contextlib.contextmanager
    def batched_sends(self) -> Iterator[None]:
        """Sends inside the block (a fan-out's :meth:`send_nowait` to many ranks)
        re-check the socket's readiness once, at the end, instead of once per send
        (:meth:`AsyncZmqSocket.batched_sends`). The block must not suspend."""
        sock = self._sock
        if sock is None or self._closed:
            yield
            return
        with sock.batched_sends():
            yield

    def send_nowait(self, rank: int, envelope: Envelope) -> None:
        sock = self._sock
        if sock is None or self._closed:
            raise TransportClosed("transport is not open")
        frames = self._frames(rank, envelope)
        try:
            sock.send_multipart_nowait(frames)
        except zmq.Again:
            raise WouldBlock(f"rank {rank}: high-water mark reached") from None
        except zmq.ZMQError as exc:
            raise self._send_error(rank, exc) from None
        except SocketClosed:
            raise TransportClosed("transport is closed") from None
        self.counters["sent"] += 1

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
        sock = self._sock
        if sock is None:
            raise TransportClosed("transport is not open")
        while True:
            if self._pending:
                return self._pending.popleft()
            try:
                msg = sock.recv_multipart_nowait()
                if msg is None:
                    # Nothing queued. Let the tasks the last events woke (a caller whose
                    # reply just came) run before this one sets up its wait: that setup
                    # then overlaps the next round trip instead of delaying the caller.
                    await self._checkpoint()
                    if self._pending:
                        continue
                    try:
                        msg = await sock.recv_multipart()
                    except ReceiveInterrupted:
                        continue  # woken for a pending event
            except SocketClosed:
                raise TransportClosed("transport is closed") from None
            return self._event(msg)

    def _event(self, msg: list[bytes]) -> TransportEvent:
        self.counters["received"] += 1
        if len(msg) != 2:
            return Dropped("framing", f"expected 2 frames, got {len(msg)}",
                           sum(len(f) for f in msg))
        identity, data = msg
        named = self._rank_of.get(identity)
        if named is not None and self.curve is None:
            # a rank's request identity seen before, no key binding to check
            self._known.add(named)
            fast = self._fast_decode
            if fast is not None and len(data) <= self.codec.max_message_size:
                try:
                    return Received(fast(data), named, identity, len(data))
                except Exception:
                    pass  # not an envelope: decode_event gives the verdict
            return decode_event(self.codec, data, named, identity)
        named = rank_from_identity(identity)
        if named is not None and len(self._rank_of) < _CACHE_LIMIT:
            self._rank_of[identity] = named
        beacon = named is None
        if named is None:
            named = rank_from_beacon_identity(identity)
            if named is None:
                self.counters["unknown_peer"] += 1
                return Dropped("unknown_peer", f"identity {identity[:32]!r} is not a rank",
                               len(data))
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
            return event
        self._known.add(rank)
        return decode_event(self.codec, data, rank, identity)

    def _push(self, event: TransportEvent) -> None:
        self._pending.append(event)
        sock = self._sock
        if sock is not None and not sock.closed:
            sock.interrupt_receive()  # a receive in progress returns to pick the event up

    async def _watch_disconnects(self) -> None:
        monitor = self._monitors[0]
        async for event, _value, _endpoint in monitor.events():
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
                try:
                    sock.send_multipart_nowait([rank_identity(rank), self._probe_hb])
                except zmq.ZMQError as exc:
                    if exc.errno == zmq.EHOSTUNREACH:
                        self._known.discard(rank)
                        self._push(PeerDisconnected(rank, "connection closed"))
                except SocketClosed:
                    return


class _PerRankClient(_ZmqClientBase):
    """One sending socket per rank (DEALER, PUSH or PAIR), reader tasks, monitors."""

    send_kind: int = zmq.DEALER
    bind_per_rank = False

    def __init__(self, addresses: Mapping[int, str] | Sequence[str], *, codec: Codec | None,
                 options: ZmqOptions | None, curve: CurveClientConfig | None,
                 context: zmq.Context[zmq.Socket[bytes]] | None) -> None:
        super().__init__(codec=codec, options=options, context=context)
        self.addresses: dict[int, str] = (dict(addresses) if isinstance(addresses, Mapping)
                                          else dict(enumerate(addresses)))
        self.curve = curve
        for addr in self.addresses.values():
            check_pickle_allowed(self.codec, addr, curve is not None)
        self._by_rank: dict[int, AsyncZmqSocket] = {}
        self._up: dict[int, bool] = {}
        self._auth_failed: set[int] = set()  # ranks whose CURVE server refused our key
        send, recv = anyio.create_memory_object_stream[TransportEvent](
            self.options.effective_rcvhwm(self.codec.max_message_size))
        self._events_in: MemoryObjectSendStream[TransportEvent] = send
        self._events_out: MemoryObjectReceiveStream[TransportEvent] = recv
        self._hello = b""

    def _open(self) -> None:
        self._hello = self.codec.encode(Heartbeat(-1, 0, 0))
        for rank, addr in self.addresses.items():
            raw = self._socket(self.send_kind)
            if self.send_kind == zmq.DEALER:
                raw.setsockopt(zmq.IMMEDIATE, 1)
            if self.curve is not None:
                self.curve.apply(raw)
            self._monitors.append(SocketMonitor(raw))
            if self.bind_per_rank:
                self._bind(raw, addr)
            else:
                connect_socket(raw, addr)
            self._by_rank[rank] = self._wrap(raw)
            self._up[rank] = self.bind_per_rank and addr.startswith("inproc://")

    def _start_tasks(self, tg: TaskGroup) -> None:
        for (rank, sock), monitor in zip(self._by_rank.items(), self._monitors, strict=False):
            tg.start_soon(self._watch, rank, monitor)
            if self.send_kind != zmq.PUSH:
                tg.start_soon(self._read, rank, sock)

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
            try:
                await self._events_in.send(event)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return

    async def _watch(self, rank: int, monitor: SocketMonitor) -> None:
        async for event, _value, _endpoint in monitor.events():
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
        return sock

    def send_nowait(self, rank: int, envelope: Envelope) -> None:
        sock = self._sock_for(rank)
        data = self._encode(envelope)
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
        try:
            return await self._events_out.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise TransportClosed("transport is closed") from None

    async def aclose(self) -> None:
        self._events_in.close()
        await super().aclose()
        self._events_out.close()


class ZmqDealerClientTransport(_PerRankClient):
    """Reverse orientation: each engine binds a ROUTER at ``addresses[rank]``; the
    client connects one DEALER per rank, and one SUB per rank to the engine's
    liveness beacon at ``beacon_addresses[rank]`` (default
    :func:`~ctlwire.transports.zmq_config.beacon_address_for` of the rank's
    address; a rank without one relies on in-band heartbeats). ``curve`` is a
    :class:`CurveClientConfig` (the engines are the CURVE servers)."""

    send_kind = zmq.DEALER

    def __init__(self, addresses: Mapping[int, str] | Sequence[str], *,
                 codec: Codec | None = None, options: ZmqOptions | None = None,
                 curve: CurveClientConfig | None = None,
                 context: zmq.Context[zmq.Socket[bytes]] | None = None,
                 beacon_addresses: Mapping[int, str] | None = None) -> None:
        super().__init__(addresses, codec=codec, options=options, curve=curve, context=context)
        self.beacon_addresses: dict[int, str] = {}
        for rank, address in self.addresses.items():
            beacon = (beacon_addresses or {}).get(rank) or beacon_address_for(address)
            if beacon is not None:
                self.beacon_addresses[rank] = beacon
        self._beacons: dict[int, AsyncZmqSocket] = {}

    def _open(self) -> None:
        super()._open()
        for rank, address in self.beacon_addresses.items():
            raw = self.context.socket(zmq.SUB)
            raw.setsockopt(zmq.RCVHWM, 16)
            raw.setsockopt(zmq.LINGER, 0)
            raw.setsockopt(zmq.MAXMSGSIZE, 4096)
            raw.setsockopt(zmq.RECONNECT_IVL, self.options.reconnect_ivl_ms)
            raw.setsockopt(zmq.RECONNECT_IVL_MAX, self.options.reconnect_ivl_max_ms)
            raw.setsockopt(zmq.SUBSCRIBE, b"")
            if self.curve is not None:
                self.curve.apply(raw)
            raw.connect(address)
            self._beacons[rank] = self._wrap(raw)

    def _start_tasks(self, tg: TaskGroup) -> None:
        super()._start_tasks(tg)
        for rank, sock in self._beacons.items():
            tg.start_soon(self._read_beacon, rank, sock)

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
                 options: ZmqOptions | None = None, allow_insecure_tcp: bool = False) -> None:
        super().__init__(addresses, codec=codec, options=options, curve=None, context=context)
        for addr in self.addresses.values():
            check_bind_address(addr, curve=False, allow_insecure_tcp=allow_insecure_tcp)


class ZmqPushPullClientTransport(_PerRankClient):
    """Requests go out on one PUSH per rank (connected to ``request_addresses[rank]``,
    where the engine's PULL binds); replies come back on one PULL bound at
    ``reply_address`` (where every engine's PUSH connects)."""

    send_kind = zmq.PUSH

    def __init__(self, request_addresses: Mapping[int, str] | Sequence[str],
                 reply_address: str | None = None, *, codec: Codec | None = None,
                 options: ZmqOptions | None = None,
                 context: zmq.Context[zmq.Socket[bytes]] | None = None,
                 allow_insecure_tcp: bool = False) -> None:
        super().__init__(request_addresses, codec=codec, options=options, curve=None,
                         context=context)
        self._private_reply = reply_address is None
        self.reply_address = reply_address or self._private_address("replies")
        check_bind_address(self.reply_address, curve=False,
                           allow_insecure_tcp=allow_insecure_tcp)
        check_pickle_allowed(self.codec, self.reply_address, False)
        self._pull: AsyncZmqSocket | None = None

    def _open(self) -> None:
        super()._open()
        raw = self._socket(zmq.PULL)
        self.reply_address = self._bind(raw, self.reply_address, self._private_reply)
        self._pull = self._wrap(raw)

    def _start_tasks(self, tg: TaskGroup) -> None:
        super()._start_tasks(tg)
        assert self._pull is not None
        tg.start_soon(self._read, None, self._pull)
