"""The part every ZeroMQ engine-side transport shares (:mod:`ctlwire.transports.zmq_engine`
has the transports themselves): opening and closing the sockets, the liveness
beacon, receiving (the next event queued, and whether one is) and sending.

The sync methods (:meth:`~ZmqEngineBase.receive_one`, :meth:`~ZmqEngineBase.readable`,
:meth:`~ZmqEngineBase.send_encoded_nowait`) call the raw sockets directly from
the thread that opened the transport until its first async receive or send
(no task can be suspended on the socket before that); after it, every call
goes through :class:`~ctlwire.transports.zmq_socket.AsyncZmqSocket`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

import zmq

from ctlwire.transports.beacon_routes import BeaconRoutes
from ctlwire.transports.codec import Codec, MsgpackCodec
from ctlwire.transports.connection_guard import ConnectionGuard
from ctlwire.transports.curve import CurveAuthenticator
from ctlwire.transports.envelope import Envelope
from ctlwire.transports.errors import SocketClosed, TransportClosed, Unroutable, WouldBlock
from ctlwire.transports.memory import decode_event
from ctlwire.transports.redial import Redialer
from ctlwire.transports.transport import Dropped, Received, Route, TransportEvent
from ctlwire.transports.zmq_beacon import BeaconStatus, LivenessBeacon, configure_beacon_socket
from ctlwire.transports.zmq_config import (
    TransportContext,
    ZmqOptions,
    bind_socket,
    make_socket,
    remove_ipc_file,
)
from ctlwire.transports.zmq_socket import AsyncZmqSocket

_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_SNDMORE = int(zmq.NOBLOCK) | int(zmq.SNDMORE)
_POLLIN = int(zmq.POLLIN)
# zmq_poll with no timeout reads a socket's EVENTS without raising, where a receive
# that finds nothing raises zmq.Again (and a read of EVENTS through Socket.get makes
# a SocketOption enum each call)
_zmq_poll = zmq.zmq_poll

__all__ = ["ZmqEngineBase"]


class ZmqEngineBase:
    """One receiving socket (and the same or another for sending)."""

    recv_kind = zmq.DEALER
    routed = False  # frames carry a routing identity (ROUTER)
    #: replies may go to any peer that can connect (a socket that binds): what libzmq
    #: queues for them is bounded in bytes (ZmqOptions.effective_sndhwm); an engine
    #: that dials sends only to the peer it chose
    replies_to_any_peer = False

    def __init__(self, rank: int, *, codec: Codec | None,
                 options: ZmqOptions | None,
                 context: zmq.Context[zmq.Socket[bytes]] | None) -> None:
        self.rank = rank
        self.codec = codec or MsgpackCodec()
        self.options = options or ZmqOptions()
        self._context = TransportContext(context)
        self._recv: AsyncZmqSocket | None = None
        self._send: AsyncZmqSocket | None = None
        self._auth: CurveAuthenticator | None = None
        self._opened = False
        self._closed = False
        self._bound_ipc: list[str] = []
        self._beacon: LivenessBeacon | None = None
        #: dials the request socket again where libzmq gave up (a socket that dials)
        self._redialer: Redialer | None = None
        self._raw: list[zmq.Socket[bytes]] = []  # every socket made, closed by close()
        self._guards: list[ConnectionGuard] = []  # one per listening socket, stopped first
        # hot path: the codec's envelope decoder and encoder, for frames within the limit
        self._fast_decode = self.codec.fast_envelope_decoder()
        self._max_size = self.codec.max_message_size
        # the sync hot path (see _enable_direct): the raw sockets' own recv and send,
        # used from the owner thread until the first async receive or send
        self._direct = False
        self._owner = 0
        self._raw_recv_sock: zmq.Socket[bytes] | None = None
        self._raw_send: Callable[..., Any] | None = None
        #: ``zmq_poll``'s argument asking whether the receiving socket has input
        self._probe: list[tuple[zmq.Socket[bytes], int]] = []
        #: the ``ZMQ_RCVTIMEO`` (ms) last set on it (``receive_one`` with a timeout)
        self._rcvtimeo = -1

    def _bind(self, raw: zmq.Socket[bytes], address: str) -> str:
        address = bind_socket(raw, address)
        if address.startswith("ipc://"):
            self._bound_ipc.append(address)
        return address

    def _guard(self, raw: zmq.Socket[bytes], max_connections: int | None) -> None:
        """Bound the connections of the listening socket ``raw`` (None: no bound)."""
        if max_connections is not None:
            guard = ConnectionGuard(raw, max_connections,
                                    name=f"ctlwire-connection-guard-{self.rank}")
            self._guards.append(guard)
            guard.start()

    @property
    def connections_refused(self) -> int:
        """Connections refused because a listening socket had ``max_connections``
        open (:class:`~ctlwire.transports.connection_guard.ConnectionGuard`)."""
        beacon = self._beacon.connections_refused if self._beacon is not None else 0
        return beacon + sum(g.refused for g in self._guards)

    @property
    def open_connections(self) -> int:
        """Connections open now on this transport's listening sockets (as their
        monitors last reported; 0 for a transport that only connects)."""
        return sum(g.open_connections for g in self._guards)

    def queued_bytes_bound(self) -> int:
        """The most bytes libzmq may hold for one connection of this transport
        (both directions, the messages being encoded and decoded included)."""
        limit = self.codec.max_message_size
        options = self.options
        messages = (options.effective_sndhwm(limit, peer_sized=self.replies_to_any_peer)
                    + options.effective_rcvhwm(limit) + 2)
        return messages * options.hard_limit(limit)

    @property
    def context(self) -> zmq.Context[zmq.Socket[bytes]]:
        """The context the sockets are made in: the one given, else this transport's
        own, made when it opens and terminated when it closes."""
        return self._context.get()

    def _socket(self, kind: int) -> zmq.Socket[bytes]:
        sock = make_socket(self.context, kind)
        self._raw.append(sock)
        self.options.apply(sock, self.codec.max_message_size,
                           peer_sized_sends=self.replies_to_any_peer)
        return sock

    def _setup(self) -> None:
        raise NotImplementedError

    def _enable_direct(self) -> None:
        """After ``_setup``: let the sync methods (:meth:`receive_one`,
        :meth:`readable`, :meth:`send_encoded_nowait`) call the raw sockets directly.

        The :class:`AsyncZmqSocket` wrapper exists for tasks suspended on the
        socket (the fd-edge state machine: a socket call must re-check readiness
        for them). None can be suspended before the first async :meth:`receive`
        or :meth:`send` of this transport, which turns the direct path off for
        good; a sync engine (``poll()``) never makes one, and saves the wrapper's
        per-message layers. Only from the thread that opened the transport (any
        other goes through the wrapper, which raises ForeignThreadError)."""
        if self._recv is None or self._send is None:
            return
        recv_raw, send_raw = self._recv.socket, self._send.socket
        self._owner = threading.get_ident()
        self._raw_recv_sock = recv_raw
        self._raw_send = send_raw.send
        self._probe = [(recv_raw, _POLLIN)]
        self._rcvtimeo = -1  # a new socket: libzmq's default
        self._direct = True

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
                                name=f"ctlwire-beacon-{self.rank}",
                                max_connections=self._beacon_max_connections(),
                                routes=self._beacon_routes())
        beacon.start()
        self._beacon = beacon
        return True

    def _beacon_max_connections(self) -> int | None:
        """The bound on the beacon socket's connections where it binds (None: none)."""
        return None

    def _beacon_routes(self) -> BeaconRoutes | None:
        """The clients a beacon that binds (a ROUTER) heartbeats to (None: it dials)."""
        return None

    @property
    def beacon_refusals(self) -> dict[str, int]:
        """What a beacon that binds refused: routes (its table full of live ones) and
        frames that were not a client's hello."""
        routes = self._beacon.routes if self._beacon is not None else None
        if routes is None:
            return {"routes": 0, "frames": 0}
        return {"routes": routes.refused_routes, "frames": routes.refused_frames}

    @property
    def beacon(self) -> LivenessBeacon | None:
        return self._beacon

    def _new_beacon_socket(self, kind: int) -> zmq.Socket[bytes]:
        raw = make_socket(self.context, kind)
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
        self._enable_direct()

    def close(self) -> None:
        """Close with the configured linger; idempotent; never hangs."""
        if self._closed:
            return
        self._closed = True
        if self._beacon is not None:
            self._beacon.stop()
        for guard in self._guards:  # before the sockets they watch
            guard.stop()
        if self._redialer is not None:
            self._redialer.close()
        for sock in {id(s): s for s in (self._recv, self._send) if s is not None}.values():
            sock.close(self.options.linger_ms)
        for raw in self._raw:  # one a failed bind/connect left unwrapped
            if not raw.closed:
                raw.close(self.options.linger_ms)
        if self._auth is not None:
            self._auth.stop()
        self._context.close()
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

    def upkeep(self) -> None:
        """Periodic upkeep, from the thread that uses the transport (an engine's loop
        calls it about once a heartbeat interval): a request connection libzmq ended
        for good (a frame over ``MAXMSGSIZE``) is dialed again
        (:mod:`~ctlwire.transports.redial`), so the rank is routable again."""
        if self._redialer is not None and not self._closed:
            self._redialer.tend(time.monotonic())

    @property
    def redials(self) -> int:
        """How many times the request connection was dialed again after libzmq gave up."""
        return self._redialer.redials if self._redialer is not None else 0

    @property
    def auth_rejections(self) -> int:
        """Client keys this engine's CURVE authenticator refused (engines that bind)."""
        return self._auth.rejected if self._auth is not None else 0

    # -- receiving ---------------------------------------------------------------
    def _event(self, msg: list[bytes]) -> TransportEvent:
        fast = self._fast_decode
        if fast is not None and len(msg) == 1 and not self.routed:
            data = msg[0]
            size = len(data)
            if size <= self._max_size:
                try:
                    return Received(fast(data), None, None, size)
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

    def receive_one(self, timeout: float = 0.0) -> TransportEvent | None:
        """The next event, waiting up to ``timeout`` s (millisecond granularity) for
        one when none is queued; None when none came. :meth:`try_receive` (after
        :meth:`wait_readable` for a ``timeout``), on the raw socket from the owner
        thread of a sync engine (see :meth:`_enable_direct`).

        Direct path: with no ``timeout``, whether a message is queued is asked
        first (``zmq_poll`` with no timeout: the socket's ``EVENTS``), so finding
        none raises nothing; with one, the wait is the receive itself (libzmq's
        ``ZMQ_RCVTIMEO``: a queued message is taken without a system call). A
        one-frame message within the codec's limit is decoded here (the common
        case), any other goes through :meth:`_event`."""
        if not (self._direct and not self._closed and threading.get_ident() == self._owner):
            if timeout and not self.wait_readable(timeout):
                return None
            return self.try_receive()
        try:
            sock = self._raw_recv_sock
            assert sock is not None
            if timeout:
                ms = int(timeout * 1000)
                if ms != self._rcvtimeo:
                    sock.setsockopt(zmq.RCVTIMEO, ms)
                    self._rcvtimeo = ms
                frame = sock.recv(0, copy=False)
            else:
                if not _zmq_poll(self._probe, 0):
                    return None
                frame = sock.recv(_NOBLOCK, copy=False)
            if frame.more:
                parts = [frame.bytes]
                while frame.more:
                    frame = sock.recv(_NOBLOCK, copy=False)
                    parts.append(frame.bytes)
                return self._event(parts)
        except zmq.Again:
            return None
        except zmq.ZMQError:
            if not self._recv_sock().closed:
                raise
            raise TransportClosed("engine transport is closed") from None
        data = frame.bytes
        if self.routed:
            return self._event([data])  # one frame where two belong: dropped, counted
        fast = self._fast_decode
        if fast is not None and len(data) <= self._max_size:
            try:
                return Received(fast(data), None, None, len(data))
            except Exception:
                pass  # not an envelope: decode_event gives the verdict
        return decode_event(self.codec, data, None, None)

    def readable(self) -> bool:
        """Whether a message can be received now, by the socket's ``EVENTS``
        (raises nothing; False once closed). Direct path only: through the
        wrapper (tasks may wait on the socket's fd, whose edge a read of
        ``EVENTS`` may consume) it says True, and :meth:`receive_one` finds out."""
        if not (self._direct and not self._closed and threading.get_ident() == self._owner):
            return not self._closed
        try:
            return bool(_zmq_poll(self._probe, 0))
        except zmq.ZMQError:
            return False

    def wait_readable(self, timeout: float) -> bool:
        """Block this thread up to ``timeout`` s until a message can be received."""
        sock = self._recv_sock()
        try:
            return sock.poll_readable(timeout)
        except (SocketClosed, zmq.ZMQError):
            return False

    async def receive(self) -> TransportEvent:
        self._direct = False  # a task may be suspended on the socket from now on
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
        path encodes with :meth:`Codec.fast_envelope_encoder`). Same errors.

        A send that finds the pipe full is tried once more after reading the
        socket's ``EVENTS``: libzmq learns that its I/O thread has drained the
        pipe from notices a send processes at most about once a millisecond,
        which a burst of replies outruns when ``SNDHWM`` is small
        (:meth:`ZmqOptions.effective_sndhwm`); reading ``EVENTS`` processes them
        now. :class:`WouldBlock` then means the peer really is not reading."""
        if self.routed and not isinstance(route, bytes):
            raise Unroutable(self.rank, f"no client route {route!r}")
        direct = self._direct and not self._closed and threading.get_ident() == self._owner
        for retry in (False, True):
            if retry:
                sock = self._send
                if sock is None or self._closed:
                    raise WouldBlock("high-water mark reached")
                try:
                    sock.socket.getsockopt(zmq.EVENTS)
                except zmq.ZMQError:
                    raise TransportClosed("engine transport is closed") from None
            try:
                if direct:
                    send = self._raw_send
                    assert send is not None
                    if self.routed:
                        # libzmq takes all parts or, at the first, none
                        send(route, _NOBLOCK_SNDMORE)
                    send(data, _NOBLOCK)
                    return
                sock = self._send
                if sock is None or self._closed:
                    raise TransportClosed("engine transport is not open")
                sock.send_multipart_nowait([route, data] if self.routed and isinstance(route, bytes)
                                           else [data])
                return
            except zmq.Again:
                if retry:
                    raise WouldBlock("high-water mark reached") from None
            except zmq.ZMQError as exc:
                self._raise_unroutable(route, exc)
                if self._send_sock().closed:
                    raise TransportClosed("engine transport is closed") from None
                raise
            except SocketClosed:
                raise TransportClosed("engine transport is closed") from None

    async def send(self, route: Route, envelope: Envelope) -> None:
        self._direct = False  # a task may be suspended on the socket from now on
        frames = self._frames(route, envelope)
        try:
            await self._send_sock().send_multipart(frames)
        except zmq.ZMQError as exc:
            self._raise_unroutable(route, exc)
            raise
        except SocketClosed:
            raise TransportClosed("engine transport is closed") from None

    def _raise_unroutable(self, route: Route, exc: zmq.ZMQError) -> None:
        """A send to ``route`` failed with ``exc``: EHOSTUNREACH means the client that
        asked is gone (its route is forgotten, Unroutable raised); else returns."""
        if exc.errno == zmq.EHOSTUNREACH:
            self._forget_route(route)
            raise Unroutable(self.rank, "the client that asked is gone") from None

    def _forget_route(self, route: Route) -> None:
        pass

    def heartbeat_routes(self) -> Iterable[Route]:
        return () if self._closed or not self._opened else (None,)
