"""ZeroMQ engine-side transports: usable from an async engine and from a sync busy loop.

* :class:`ZmqDealerEngineTransport` — the default: a DEALER with identity
  ``rank-N`` connects to the client's ROUTER.
* :class:`ZmqRouterEngineTransport` — the reverse orientation: the engine binds
  a ROUTER; replies are routed back to the client identity that asked.
* :class:`ZmqPushPullEngineTransport` — a bound PULL for requests, a PUSH
  connected to the client's reply PULL.
* :class:`ZmqPairEngineTransport` — an inproc PAIR (same process, same context).

Synchronous use (:meth:`open`, :meth:`try_receive`, :meth:`wait_readable`,
:meth:`send_nowait`, :meth:`close`) never needs an event loop; asynchronous use
(``async with``, :meth:`receive`, :meth:`send`) works on asyncio and trio. The
socket belongs to the thread that opened it (a use from another thread raises
:class:`~ctlwire.transports.errors.ForeignThreadError`). Malformed frames come
back as ``Dropped`` events carrying the reply route and the salvaged request
id, so the endpoint can answer them.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

import zmq

from ctlwire.transports.codec import Codec, MsgpackCodec, check_pickle_allowed
from ctlwire.transports.curve import CurveAuthenticator, CurveClientConfig, CurveServerConfig
from ctlwire.transports.envelope import Envelope, Heartbeat, Request
from ctlwire.transports.errors import SocketClosed, TransportClosed, Unroutable, WouldBlock
from ctlwire.transports.memory import decode_event
from ctlwire.transports.transport import Dropped, Received, Route, TransportEvent
from ctlwire.transports.zmq_beacon import BeaconStatus, LivenessBeacon, configure_beacon_socket
from ctlwire.transports.zmq_config import (
    ZmqOptions,
    beacon_address_for,
    beacon_identity,
    bind_socket,
    check_bind_address,
    connect_socket,
    rank_identity,
    remove_ipc_file,
)
from ctlwire.transports.zmq_socket import AsyncZmqSocket

__all__ = [
    "ZmqDealerEngineTransport",
    "ZmqPairEngineTransport",
    "ZmqPushPullEngineTransport",
    "ZmqRouterEngineTransport",
]


class _ZmqEngineBase:
    """One receiving socket (and the same or another for sending)."""

    recv_kind = zmq.DEALER
    routed = False  # frames carry a routing identity (ROUTER)

    def __init__(self, rank: int, *, codec: Codec | None,
                 options: ZmqOptions | None,
                 context: zmq.Context[zmq.Socket[bytes]] | None) -> None:
        self.rank = rank
        self.codec = codec or MsgpackCodec()
        self.options = options or ZmqOptions()
        self._own_context = context is None
        self.context: zmq.Context[zmq.Socket[bytes]] = context or zmq.Context()
        self._recv: AsyncZmqSocket | None = None
        self._send: AsyncZmqSocket | None = None
        self._auth: CurveAuthenticator | None = None
        self._opened = False
        self._closed = False
        self._bound_ipc: list[str] = []
        self._beacon: LivenessBeacon | None = None
        self._raw: list[zmq.Socket[bytes]] = []  # every socket made, closed by close()
        # hot path: the codec's envelope decoder and encoder, for frames within the limit
        self._fast_decode = self.codec.fast_envelope_decoder()
        self._max_size = self.codec.max_message_size

    def _bind(self, raw: zmq.Socket[bytes], address: str) -> str:
        address = bind_socket(raw, address)
        if address.startswith("ipc://"):
            self._bound_ipc.append(address)
        return address

    def _socket(self, kind: int) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = self.context.socket(kind)
        self._raw.append(sock)
        self.options.apply(sock, self.codec.max_message_size)
        return sock

    def _setup(self) -> None:
        raise NotImplementedError

    # -- liveness beacon -----------------------------------------------------------
    def _beacon_socket(self) -> Callable[[], zmq.Socket[bytes]] | None:
        """A factory of this transport's beacon socket (run in the beacon's
        thread), or None where this transport has no beacon."""
        return None

    def start_beacon(self, interval: float, status: BeaconStatus) -> bool:
        """Send ``status()`` heartbeats every ``interval`` s from a thread and a
        socket of their own (:class:`~ctlwire.transports.zmq_beacon.LivenessBeacon`),
        so they keep flowing while the engine's thread blocks. True when
        started; False where this transport has none (the engine then sends
        heartbeats in-band). Call after :meth:`open`; stopped by :meth:`close`."""
        if self._closed or not self._opened or self._beacon is not None:
            return self._beacon is not None
        make = self._beacon_socket()
        if make is None:
            return False
        beacon = LivenessBeacon(make, self.codec, interval, status,
                                name=f"ctlwire-beacon-{self.rank}")
        beacon.start()
        self._beacon = beacon
        return True

    @property
    def beacon(self) -> LivenessBeacon | None:
        return self._beacon

    def _new_beacon_socket(self, kind: int) -> zmq.Socket[bytes]:
        raw: zmq.Socket[bytes] = self.context.socket(kind)
        configure_beacon_socket(raw)
        return raw

    def open(self) -> None:
        """Create, configure and bind/connect the socket(s); idempotent."""
        if self._closed:
            raise TransportClosed("engine transport is closed")
        if self._opened:
            return
        self._opened = True
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close with the configured linger; idempotent; never hangs."""
        if self._closed:
            return
        self._closed = True
        if self._beacon is not None:
            self._beacon.stop()
        for sock in {id(s): s for s in (self._recv, self._send) if s is not None}.values():
            sock.close(self.options.linger_ms)
        for raw in self._raw:  # one a failed bind/connect left unwrapped
            if not raw.closed:
                raw.close(self.options.linger_ms)
        if self._auth is not None:
            self._auth.stop()
        if self._own_context:
            self.context.term()
        for address in self._bound_ipc:
            remove_ipc_file(address)

    async def __aenter__(self) -> Any:
        self.open()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def auth_rejections(self) -> int:
        """Client keys this engine's CURVE authenticator refused (engines that bind)."""
        return self._auth.rejected if self._auth is not None else 0

    # -- receiving ---------------------------------------------------------------
    def _event(self, msg: list[bytes]) -> TransportEvent:
        fast = self._fast_decode
        if fast is not None and len(msg) == 1 and not self.routed:
            data = msg[0]
            if len(data) <= self._max_size:
                try:
                    return Received(fast(data), None, None, len(data))
                except Exception:
                    pass  # not an envelope: decode_event gives the verdict
        if self.routed:
            if len(msg) != 2:
                return Dropped("framing", f"expected 2 frames, got {len(msg)}",
                               sum(len(f) for f in msg), None, msg[0] if msg else None)
            route, data = msg
            event = decode_event(self.codec, data, None, route)
            self._note_route(route, event)
            return event
        if len(msg) != 1:
            return Dropped("framing", f"expected 1 frame, got {len(msg)}",
                           sum(len(f) for f in msg))
        return decode_event(self.codec, msg[0], None, None)

    def _note_route(self, route: bytes, event: TransportEvent) -> None:
        pass

    def _recv_sock(self) -> AsyncZmqSocket:
        if self._recv is None or self._closed:
            raise TransportClosed("engine transport is not open")
        return self._recv

    def try_receive(self) -> TransportEvent | None:
        try:
            msg = self._recv_sock().recv_multipart_nowait()
        except SocketClosed:
            raise TransportClosed("engine transport is closed") from None
        return None if msg is None else self._event(msg)

    def receive_ready(self, limit: int) -> list[TransportEvent]:
        """Up to ``limit`` events that can be received now, without blocking (an
        empty list when none is queued): :meth:`try_receive` in a loop, for an
        engine that takes every queued request per wake-up."""
        sock = self._recv
        if sock is None or self._closed:
            raise TransportClosed("engine transport is not open")
        recv = sock.recv_multipart_nowait
        fast = None if self.routed else self._fast_decode
        max_size = self._max_size
        events: list[TransportEvent] = []
        append = events.append
        try:
            while len(events) < limit:
                msg = recv()
                if msg is None:
                    break
                if fast is not None and len(msg) == 1:
                    data = msg[0]
                    size = len(data)
                    if size <= max_size:
                        try:
                            append(Received(fast(data), None, None, size))
                            continue
                        except Exception:
                            pass  # not an envelope: decode_event gives the verdict
                append(self._event(msg))
        except SocketClosed:
            if not events:
                raise TransportClosed("engine transport is closed") from None
        return events

    def wait_readable(self, timeout: float) -> bool:
        """Block this thread up to ``timeout`` s until a message can be received."""
        sock = self._recv_sock()
        try:
            return sock.poll_readable(timeout)
        except (SocketClosed, zmq.ZMQError):
            return False

    async def receive(self) -> TransportEvent:
        try:
            msg = await self._recv_sock().recv_multipart()
        except SocketClosed:
            raise TransportClosed("engine transport is closed") from None
        return self._event(msg)

    # -- sending -----------------------------------------------------------------
    def _frames(self, route: Route, envelope: Envelope) -> list[bytes]:
        data = self.codec.encode(envelope)
        if self.routed:
            if not isinstance(route, bytes):
                raise Unroutable(self.rank, f"no client route {route!r}")
            return [route, data]
        return [data]

    def _send_sock(self) -> AsyncZmqSocket:
        if self._send is None or self._closed:
            raise TransportClosed("engine transport is not open")
        return self._send

    def send_nowait(self, route: Route, envelope: Envelope) -> None:
        self.send_encoded_nowait(route, self.codec.encode(envelope))

    def send_encoded_nowait(self, route: Route, data: bytes) -> None:
        """:meth:`send_nowait` of an envelope the caller already encoded with this
        transport's codec, within its ``max_message_size`` (an engine's reply hot
        path encodes with :meth:`Codec.fast_envelope_encoder`). Same errors."""
        if self.routed:
            if not isinstance(route, bytes):
                raise Unroutable(self.rank, f"no client route {route!r}")
            frames = [route, data]
        else:
            frames = [data]
        sock = self._send
        if sock is None or self._closed:
            raise TransportClosed("engine transport is not open")
        try:
            sock.send_multipart_nowait(frames)
        except zmq.Again:
            raise WouldBlock("high-water mark reached") from None
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                self._forget_route(route)
                raise Unroutable(self.rank, "the client that asked is gone") from None
            raise
        except SocketClosed:
            raise TransportClosed("engine transport is closed") from None

    async def send(self, route: Route, envelope: Envelope) -> None:
        frames = self._frames(route, envelope)
        try:
            await self._send_sock().send_multipart(frames)
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                self._forget_route(route)
                raise Unroutable(self.rank, "the client that asked is gone") from None
            raise
        except SocketClosed:
            raise TransportClosed("engine transport is closed") from None

    def _forget_route(self, route: Route) -> None:
        pass

    def heartbeat_routes(self) -> Iterable[Route]:
        return () if self._closed or not self._opened else (None,)


class ZmqDealerEngineTransport(_ZmqEngineBase):
    """A DEALER with identity ``rank-N`` connecting to the client's ROUTER at ``address``.

    ``curve`` is a :class:`CurveClientConfig` when the client's ROUTER runs CURVE.
    Pickle over tcp is refused without CURVE.
    """

    def __init__(self, address: str, rank: int, *, codec: Codec | None = None,
                 options: ZmqOptions | None = None, curve: CurveClientConfig | None = None,
                 context: zmq.Context[zmq.Socket[bytes]] | None = None) -> None:
        super().__init__(rank, codec=codec, options=options, context=context)
        self.address = address
        self.curve = curve
        check_pickle_allowed(self.codec, address, curve is not None)

    def _setup(self) -> None:
        raw = self._socket(zmq.DEALER)
        raw.setsockopt(zmq.IDENTITY, rank_identity(self.rank))
        if self.curve is not None:
            self.curve.apply(raw)
        connect_socket(raw, self.address)
        self._recv = self._send = AsyncZmqSocket(raw)

    def _beacon_socket(self) -> Callable[[], zmq.Socket[bytes]] | None:
        def make() -> zmq.Socket[bytes]:
            raw = self._new_beacon_socket(zmq.DEALER)
            raw.setsockopt(zmq.IDENTITY, beacon_identity(self.rank))
            if self.curve is not None:
                self.curve.apply(raw)
            raw.connect(self.address)
            return raw

        return make


class ZmqRouterEngineTransport(_ZmqEngineBase):
    """The engine binds a ROUTER at ``address``; clients connect DEALERs.

    Replies go back to the identity that sent the request. The liveness
    beacon binds a PUB at ``beacon_address`` (default
    :func:`~ctlwire.transports.zmq_config.beacon_address_for` ``(address)``)
    that clients subscribe to; without one, heartbeats go in-band to every
    client heard from (up to ``max_clients``).

    The table of client routes holds only routes that sent a valid request or
    heartbeat (a frame that does not decode as one never enters it). When it
    is full, a new route takes the place of the least recently heard one only
    if that one has been silent for ``route_idle`` s; otherwise the new route
    is refused and counted (:attr:`routes_refused`): junk identities cannot
    push a live client out.
    ``curve`` is a :class:`CurveServerConfig` allow-listing the clients' keys.
    """

    routed = True

    def __init__(self, address: str, rank: int, *, codec: Codec | None = None,
                 options: ZmqOptions | None = None, curve: CurveServerConfig | None = None,
                 context: zmq.Context[zmq.Socket[bytes]] | None = None,
                 allow_insecure_tcp: bool = False, max_clients: int = 64,
                 beacon_address: str | None = None, route_idle: float = 10.0) -> None:
        super().__init__(rank, codec=codec, options=options, context=context)
        self.address = address
        self.beacon_address = beacon_address or beacon_address_for(address)
        if self.beacon_address is not None:
            check_bind_address(self.beacon_address, curve=curve is not None,
                               allow_insecure_tcp=allow_insecure_tcp)
        self.curve = curve
        check_bind_address(address, curve=curve is not None,
                           allow_insecure_tcp=allow_insecure_tcp)
        check_pickle_allowed(self.codec, address, curve is not None)
        self._clients: OrderedDict[bytes, float] = OrderedDict()  # route -> last heard
        self.max_clients = max_clients
        self.route_idle = route_idle
        self.routes_refused = 0
        self.junk_routes = 0  # frames whose route never entered the table (not a request)

    def _setup(self) -> None:
        raw = self._socket(zmq.ROUTER)
        if self.curve is not None:
            self._auth = CurveAuthenticator(self.context, self.curve)
            self._auth.start()
            self.curve.apply(raw)
        self.address = self._bind(raw, self.address)
        self._recv = self._send = AsyncZmqSocket(raw)

    def _beacon_socket(self) -> Callable[[], zmq.Socket[bytes]] | None:
        address = self.beacon_address
        if address is None:
            return None

        def make() -> zmq.Socket[bytes]:
            raw = self._new_beacon_socket(zmq.PUB)
            if self.curve is not None:
                self.curve.apply(raw)
            try:
                self.beacon_address = self._bind(raw, address)
            except BaseException:
                raw.close(0)
                raise
            return raw

        return make

    def _note_route(self, route: bytes, event: TransportEvent) -> None:
        if type(event) is not Received or type(event.envelope) not in (Request, Heartbeat):
            if route not in self._clients:
                self.junk_routes += 1
            return
        clients = self._clients
        now = time.monotonic()
        if route in clients:
            clients[route] = now
            clients.move_to_end(route)
            return
        if len(clients) >= self.max_clients:
            oldest, heard = next(iter(clients.items()))
            if now - heard < self.route_idle:
                self.routes_refused += 1
                return
            del clients[oldest]
        clients[route] = now

    def _forget_route(self, route: Route) -> None:
        if isinstance(route, bytes):
            self._clients.pop(route, None)

    def heartbeat_routes(self) -> Iterable[Route]:
        return list(self._clients) if not self._closed else ()


class ZmqPushPullEngineTransport(_ZmqEngineBase):
    """A PULL bound at ``request_address``, a PUSH connected to ``reply_address``."""

    def __init__(self, request_address: str, reply_address: str, rank: int, *,
                 codec: Codec | None = None, options: ZmqOptions | None = None,
                 context: zmq.Context[zmq.Socket[bytes]] | None = None,
                 allow_insecure_tcp: bool = False) -> None:
        super().__init__(rank, codec=codec, options=options, context=context)
        self.request_address = request_address
        self.reply_address = reply_address
        check_bind_address(request_address, curve=False, allow_insecure_tcp=allow_insecure_tcp)
        check_pickle_allowed(self.codec, request_address, False)
        check_pickle_allowed(self.codec, reply_address, False)

    def _setup(self) -> None:
        pull = self._socket(zmq.PULL)
        self.request_address = self._bind(pull, self.request_address)
        self._recv = AsyncZmqSocket(pull)
        push = self._socket(zmq.PUSH)
        connect_socket(push, self.reply_address)
        self._send = AsyncZmqSocket(push)

    def _beacon_socket(self) -> Callable[[], zmq.Socket[bytes]] | None:
        def make() -> zmq.Socket[bytes]:
            raw = self._new_beacon_socket(zmq.PUSH)
            raw.connect(self.reply_address)
            return raw

        return make


class ZmqPairEngineTransport(_ZmqEngineBase):
    """An inproc PAIR connecting to the client's PAIR for this rank (same context)."""

    def __init__(self, address: str, rank: int, *,
                 context: zmq.Context[zmq.Socket[bytes]], codec: Codec | None = None,
                 options: ZmqOptions | None = None) -> None:
        super().__init__(rank, codec=codec, options=options, context=context)
        self.address = address
        check_pickle_allowed(self.codec, address, False)

    def _setup(self) -> None:
        raw = self._socket(zmq.PAIR)
        connect_socket(raw, self.address)
        self._recv = self._send = AsyncZmqSocket(raw)
