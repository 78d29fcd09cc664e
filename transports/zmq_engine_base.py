"""The part every ZeroMQ engine-side transport shares (:mod:`ctlwire.transports.zmq_engine`
has the transports themselves): opening and closing the sockets, the liveness
beacon, receiving and sending.

The socket mechanism is chosen once, as the transport opens: :meth:`~ZmqEngineBase.open`
(a synchronous loop: ``poll()``, ``run_blocking``) uses the sockets directly from
the thread that opened it (:class:`~ctlwire.transports.zmq_sync_socket.SyncZmqSocket`);
``async with`` (an event loop: ``serve()``) through
:class:`~ctlwire.transports.zmq_socket.AsyncZmqSocket`, on which tasks can wait.
Every method goes through the one chosen; both share the same non-blocking calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TypeVar

import zmq

from ctlwire.transports.beacon_routes import BeaconRoutes
from ctlwire.transports.codec import Codec, MsgpackCodec
from ctlwire.transports.connection_guard import ConnectionGuard
from ctlwire.transports.curve import CurveAuthenticator
from ctlwire.transports.errors import SocketClosed, TransportClosed, Unroutable, WouldBlock
from ctlwire.transports.memory import decode_event
from ctlwire.transports.redial import Redialer
from ctlwire.transports.transport import (
    Dropped,
    EngineTransport,
    Received,
    Route,
    TransportEvent,
)
from ctlwire.transports.zmq_beacon import BeaconStatus, LivenessBeacon, configure_beacon_socket
from ctlwire.transports.zmq_config import (
    TransportContext,
    ZmqOptions,
    bind_socket,
    make_socket,
    remove_ipc_file,
)
from ctlwire.transports.zmq_socket import AsyncZmqSocket
from ctlwire.transports.zmq_sync_socket import SyncZmqSocket

__all__ = ["ZmqEngineBase"]

_T = TypeVar("_T", bound="ZmqEngineBase")


class _LoopSocket(AsyncZmqSocket):
    """The event loop's socket mechanism: an :class:`AsyncZmqSocket`, whose owner
    thread may also block for a message (a transport entered with ``async with``,
    then polled)."""

    __slots__ = ()

    def recv_multipart_within(self, timeout: float) -> list[bytes] | None:
        """:meth:`recv_multipart_nowait`, after :meth:`poll_readable` for a ``timeout``."""
        if timeout and not self.poll_readable(timeout):
            return None
        return self.recv_multipart_nowait()


EngineSocket = SyncZmqSocket | _LoopSocket
"""A socket mechanism: a synchronous loop's, or an event loop's."""


class ZmqEngineBase(EngineTransport):
    """One receiving socket (and the same or another for sending)."""

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
        self._recv: EngineSocket | None = None
        self._send: EngineSocket | None = None
        self._receiving_socket: zmq.Socket[bytes] | None = None
        #: the socket mechanism, chosen as the transport opens (None: not open)
        self._mechanism: type[EngineSocket] | None = None
        self._auth: CurveAuthenticator | None = None
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
        """Refused by the guards of the listening sockets, the beacon's included."""
        beacon = self._beacon.connections_refused if self._beacon is not None else 0
        return beacon + sum(g.refused for g in self._guards)

    @property
    def open_connections(self) -> int:
        """Open on the listening sockets, as their monitors last reported."""
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

    def _setup(self) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
        """Make, configure and bind or connect the sockets: (receiving, sending),
        the same socket or two."""
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
        if self._closed or self._mechanism is None or self._beacon is not None:
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
        """Create, configure and bind/connect the socket(s) for a synchronous loop,
        used from this thread only; idempotent (and a no-op once entered with
        ``async with``, whose sockets serve synchronous calls too)."""
        self._open(SyncZmqSocket)

    def _open(self, mechanism: type[EngineSocket]) -> None:
        if self._closed:
            raise TransportClosed("engine transport is closed")
        if self._mechanism is not None:
            if mechanism is _LoopSocket and self._mechanism is SyncZmqSocket:
                raise RuntimeError("this engine transport was opened for a synchronous "
                                   "loop (open()); an event loop enters a new one "
                                   "with async with")
            return
        self._mechanism = mechanism
        try:
            recv, send = self._setup()
            self._recv = mechanism(recv)
            self._send = self._recv if send is recv else mechanism(send)
        except BaseException:
            self.close()
            raise
        self._receiving_socket = recv

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

    async def __aenter__(self: _T) -> _T:
        """Create, configure and bind/connect the socket(s) for an event loop (tasks
        may wait on them); RuntimeError if :meth:`open` opened it already."""
        self._open(_LoopSocket)
        return self

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def receiving_socket(self) -> zmq.Socket[bytes] | None:
        """The socket requests arrive on (None until opened), for a thread that hosts
        several ranks to wait on it beside the others' (a ``zmq.Poller``). Only to
        wait on: receive and send through the transport."""
        return self._receiving_socket

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

    def try_receive(self) -> TransportEvent | None:
        return self.receive_one()

    def receive_one(self, timeout: float = 0.0) -> TransportEvent | None:
        """The next event, waiting up to ``timeout`` s (millisecond granularity) for
        one when none is queued; None when none came. Raises TransportClosed once
        closed, ForeignThreadError from a thread other than the one that opened it."""
        sock = self._recv
        if sock is None:
            raise TransportClosed("engine transport is not open")
        try:
            msg = sock.recv_multipart_within(timeout)
        except SocketClosed:
            raise TransportClosed("engine transport is closed") from None
        return None if msg is None else self._event(msg)

    def wait_readable(self, timeout: float) -> bool:
        """Block this thread up to ``timeout`` s until a message can be received."""
        sock = self._recv
        if sock is None:
            raise TransportClosed("engine transport is not open")
        try:
            return sock.poll_readable(timeout)
        except SocketClosed:
            raise TransportClosed("engine transport is closed") from None
        except zmq.ZMQError:
            return False

    async def receive(self) -> TransportEvent:
        sock = self._recv
        if sock is None:
            raise TransportClosed("engine transport is not open")
        try:
            msg = await sock.recv_multipart()
        except SocketClosed:
            raise TransportClosed("engine transport is closed") from None
        return self._event(msg)

    # -- sending -----------------------------------------------------------------
    def send_encoded_nowait(self, route: Route, data: bytes) -> None:
        """Send ``data``, an envelope encoded with this transport's codec within its
        ``max_message_size``, to ``route`` now.

        A send that finds the pipe full is tried once more after reading the
        socket's ``EVENTS``: libzmq learns that its I/O thread has drained the
        pipe from notices a send processes at most about once a millisecond,
        which a burst of replies outruns when ``SNDHWM`` is small
        (:meth:`ZmqOptions.effective_sndhwm`); reading ``EVENTS`` processes them
        now. :class:`WouldBlock` then means the peer really is not reading."""
        sock = self._send
        if sock is None:
            raise TransportClosed("engine transport is not open")
        routed = self.routed
        if routed and not isinstance(route, bytes):
            raise Unroutable(self.rank, f"no client route {route!r}")
        for retry in (False, True):
            try:
                if retry:
                    sock.refresh_events()
                if routed:  # libzmq takes both parts or, at the first, none
                    sock.send_pair_nowait(route, data)  # type: ignore[arg-type]
                else:
                    sock.send_multipart_nowait((data,))
                return
            except zmq.Again:
                if retry:
                    raise WouldBlock("high-water mark reached") from None
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH:
                    raise
                self._forget_route(route)  # the client that asked is gone
                raise Unroutable(self.rank, "the client that asked is gone") from None
            except SocketClosed:
                raise TransportClosed("engine transport is closed") from None

    def _forget_route(self, route: Route) -> None:
        pass

    def heartbeat_routes(self) -> Iterable[Route]:
        return () if self._closed or self._mechanism is None else (None,)
