"""ZeroMQ engine-side transports: usable from an async engine and from a sync busy loop.

* :class:`ZmqDealerEngineTransport` — the default: a DEALER with identity
  ``rank-N`` connects to the client's ROUTER.
* :class:`ZmqRouterEngineTransport` — the reverse orientation: the engine binds
  a ROUTER; replies are routed back to the client identity that asked.
* :class:`ZmqPushPullEngineTransport` — a bound PULL for requests, a PUSH
  connected to the client's reply PULL.
* :class:`ZmqPairEngineTransport` — an inproc PAIR (same process, same context).

Synchronous use (:meth:`open`, :meth:`receive_one`, :meth:`wait_readable`,
:meth:`send_nowait`, :meth:`close`) never needs an event loop; asynchronous use
(``async with``, :meth:`receive`, and the synchronous sends) works on asyncio and
trio; which one is chosen as the transport opens. The socket belongs to the thread
that opened it (a use from another thread raises
:class:`~ctlwire.transports.errors.ForeignThreadError`). Malformed frames come
back as ``Dropped`` events carrying the reply route and the salvaged request
id, so the endpoint can answer them. What the transports share (the socket
mechanism of each use included) is in :mod:`ctlwire.transports.zmq_engine_base`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

import zmq

from ctlwire.transports.beacon_routes import BeaconRoutes
from ctlwire.transports.codec import Codec, check_pickle_allowed
from ctlwire.transports.curve import CurveAuthenticator, CurveClientConfig, CurveServerConfig
from ctlwire.transports.envelope import Heartbeat, Request
from ctlwire.transports.group_beacon import group_beacon_identity
from ctlwire.transports.redial import Redialer
from ctlwire.transports.transport import Received, Route, TransportEvent
from ctlwire.transports.zmq_beacon import BeaconStatus, LivenessBeacon, configure_beacon_socket
from ctlwire.transports.zmq_config import (
    ZmqOptions,
    beacon_address_for,
    beacon_identity,
    check_address,
    check_bind_address,
    connect_socket,
    new_identity_tag,
    rank_from_identity,
    rank_identity,
)
from ctlwire.transports.zmq_engine_base import ZmqEngineBase

__all__ = [
    "ZmqDealerEngineTransport",
    "ZmqPairEngineTransport",
    "ZmqPushPullEngineTransport",
    "ZmqRouterEngineTransport",
    "group_beacon",
]


class ZmqDealerEngineTransport(ZmqEngineBase):
    """A DEALER with identity ``rank-N`` connecting to the client's ROUTER at ``address``.

    ``curve`` is a :class:`CurveClientConfig` when the client's ROUTER runs CURVE;
    tcp without it needs ``allow_insecure_tcp=True``, an abstract ipc name
    (``ipc://@name``) ``allow_abstract_ipc=True``. Pickle over tcp is refused
    without CURVE, and on abstract names.

    A connection libzmq ends for good (a frame over ``MAXMSGSIZE``) is dialed again
    by :meth:`upkeep` (:mod:`~ctlwire.transports.redial`).

    Under CURVE the identities carry a random tag, ``rank-N.TAG`` and ``beat-N.TAG``
    (the same tag, fixed for the transport's life): the client routes rank N's
    requests to the tagged identity it last heard authenticated with rank N's key,
    which another key holder cannot take over without knowing the tag (the
    identity travels encrypted in the CURVE handshake).
    """

    def __init__(self, address: str, rank: int, *, codec: Codec | None = None,
                 options: ZmqOptions | None = None, curve: CurveClientConfig | None = None,
                 context: zmq.Context[zmq.Socket[bytes]] | None = None,
                 allow_insecure_tcp: bool = False, identity_tag: bytes | None = None,
                 allow_abstract_ipc: bool = False) -> None:
        super().__init__(rank, codec=codec, options=options, context=context)
        self.address = address
        self.curve = curve
        check_address(address, curve=curve is not None, allow_insecure_tcp=allow_insecure_tcp,
                      allow_abstract_ipc=allow_abstract_ipc)
        check_pickle_allowed(self.codec, address, curve is not None)
        if (identity_tag is not None and curve is not None
                and rank_from_identity(rank_identity(rank, identity_tag)) != rank):
            raise ValueError("identity_tag: 1 to 32 lowercase hex digits")
        #: the routing identities' tag (under CURVE: random unless given, shared by
        #: the ranks of a group beacon; empty otherwise)
        self.identity_tag = (b"" if curve is None
                             else new_identity_tag() if identity_tag is None else identity_tag)

    def _setup(self) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
        raw = self._socket(zmq.DEALER)
        raw.setsockopt(zmq.IDENTITY, rank_identity(self.rank, self.identity_tag))
        if self.curve is not None:
            self.curve.apply(raw)
        connect_socket(raw, self.address)
        self._redialer = Redialer(raw, self.address)
        return raw, raw

    def _beacon_socket(self) -> Callable[[], zmq.Socket[bytes]] | None:
        def make() -> zmq.Socket[bytes]:
            raw = self._new_beacon_socket(zmq.DEALER)
            raw.setsockopt(zmq.IDENTITY, beacon_identity(self.rank, self.identity_tag))
            if self.curve is not None:
                self.curve.apply(raw)
            raw.connect(self.address)
            return raw

        return make


def group_beacon(transports: Sequence[ZmqDealerEngineTransport], interval: float,
                 status: BeaconStatus) -> LivenessBeacon:
    """One liveness beacon (not started) for several ranks of one process that dial
    the same client: a DEALER with identity ``beats-F-C`` (``beats-F-C.TAG`` under
    CURVE) sending, every ``interval``, one message of ``status()``'s heartbeats,
    a frame each. A client then reads one message a beat for the group instead of
    one per rank; what each heartbeat says, and how a rank is judged, is unchanged.

    ``transports``: ranks ``F .. F+C-1`` in order (``C`` at most
    :data:`~ctlwire.transports.group_beacon.MAX_BEACON_GROUP`), one address, kind of
    codec, curve and identity tag (give each the same ``identity_tag`` under CURVE), whose
    own beacons are not started. Raises ValueError otherwise."""
    if not transports:
        raise ValueError("a group beacon needs at least one rank")
    head = transports[0]
    first = head.rank
    for i, t in enumerate(transports):
        if t.rank != first + i:
            raise ValueError("a group beacon's ranks are consecutive, in order")
        if (t.address, type(t.codec), t.curve, t.identity_tag) != (
                head.address, type(head.codec), head.curve, head.identity_tag):
            raise ValueError("a group beacon's ranks share one address, kind of codec, "
                             "curve and identity tag")
        if t.beacon is not None:
            raise ValueError(f"rank {t.rank} runs a beacon of its own")
    identity = group_beacon_identity(first, len(transports), head.identity_tag)

    def make() -> zmq.Socket[bytes]:
        raw: zmq.Socket[bytes] = head.context.socket(zmq.DEALER)
        configure_beacon_socket(raw)
        raw.setsockopt(zmq.IDENTITY, identity)
        if head.curve is not None:
            head.curve.apply(raw)
        raw.connect(head.address)
        return raw

    return LivenessBeacon(make, head.codec, interval, status,
                          name=f"ctlwire-beacon-{first}+{len(transports)}")


class ZmqRouterEngineTransport(ZmqEngineBase):
    """The engine binds a ROUTER at ``address``; clients connect DEALERs.

    Replies go back to the identity that sent the request. The liveness
    beacon binds a ROUTER at ``beacon_address`` (default
    :func:`~ctlwire.transports.zmq_config.beacon_address_for` ``(address)``)
    and heartbeats to every client whose beacon DEALER said hello there (up to
    ``max_clients``, :class:`~ctlwire.transports.beacon_routes.BeaconRoutes`);
    without one, heartbeats go in-band to every client heard from (up to
    ``max_clients``).

    The table of client routes holds only routes that sent a valid request or
    heartbeat (a frame that does not decode as one never enters it). When it
    is full, a new route takes the place of the least recently heard one only
    if that one has been silent for ``route_idle`` s; otherwise the new route
    is refused and counted (:attr:`routes_refused`): junk identities cannot
    push a live client out.
    At most ``max_connections`` connections stay open on the ROUTER (and on the
    beacon's PUB); newer ones are refused and counted
    (:attr:`connections_refused`, see
    :class:`~ctlwire.transports.connection_guard.ConnectionGuard`); None: no bound.
    ``curve`` is a :class:`CurveServerConfig` allow-listing the clients' keys;
    tcp without it needs ``allow_insecure_tcp=True``, an abstract ipc name
    ``allow_abstract_ipc=True``.
    """

    routed = True
    replies_to_any_peer = True

    def __init__(self, address: str, rank: int, *, codec: Codec | None = None,
                 options: ZmqOptions | None = None, curve: CurveServerConfig | None = None,
                 context: zmq.Context[zmq.Socket[bytes]] | None = None,
                 allow_insecure_tcp: bool = False, max_clients: int = 64,
                 beacon_address: str | None = None, route_idle: float = 10.0,
                 max_connections: int | None = 64, allow_abstract_ipc: bool = False) -> None:
        super().__init__(rank, codec=codec, options=options, context=context)
        self.address = address
        self.max_connections = max_connections
        self.beacon_address = beacon_address or beacon_address_for(address)
        for bound in (address, self.beacon_address):
            if bound is not None:
                check_bind_address(bound, curve=curve is not None,
                                   allow_insecure_tcp=allow_insecure_tcp,
                                   allow_abstract_ipc=allow_abstract_ipc)
        self.curve = curve
        check_pickle_allowed(self.codec, address, curve is not None)
        self._clients: OrderedDict[bytes, float] = OrderedDict()  # route -> last heard
        self.max_clients = max_clients
        self.route_idle = route_idle
        self._routes_refused = 0
        self.junk_routes = 0  # frames whose route never entered the table (not a request)

    @property
    def routes_refused(self) -> int:
        """New client routes refused while the table was full of live ones."""
        return self._routes_refused

    def _setup(self) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
        raw = self._socket(zmq.ROUTER)
        if self.curve is not None:
            self._auth = CurveAuthenticator(self.context, self.curve)
            self._auth.start()
            self.curve.apply(raw)
        self.address = self._bind(raw, self.address)
        self._guard(raw, self.max_connections)
        return raw, raw

    def _beacon_socket(self) -> Callable[[], zmq.Socket[bytes]] | None:
        address = self.beacon_address
        if address is None:
            return None

        def make() -> zmq.Socket[bytes]:
            raw = self._new_beacon_socket(zmq.ROUTER)
            if self.curve is not None:
                self.curve.apply(raw)
            try:
                self.beacon_address = self._bind(raw, address)
            except BaseException:
                raw.close(0)
                raise
            return raw

        return make

    def _beacon_max_connections(self) -> int | None:
        return self.max_connections

    def _beacon_routes(self) -> BeaconRoutes | None:
        return BeaconRoutes(self.codec, max_routes=self.max_clients, idle=self.route_idle)

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
                self._routes_refused += 1
                return
            del clients[oldest]
        clients[route] = now

    def _forget_route(self, route: Route) -> None:
        if isinstance(route, bytes):
            self._clients.pop(route, None)

    def heartbeat_routes(self) -> Iterable[Route]:
        return list(self._clients) if not self._closed else ()


class ZmqPushPullEngineTransport(ZmqEngineBase):
    """A PULL bound at ``request_address``, a PUSH connected to ``reply_address``.
    At most ``max_connections`` connections stay open on the PULL (see
    :class:`ZmqRouterEngineTransport`). No CURVE: tcp needs ``allow_insecure_tcp=True``,
    an abstract ipc name ``allow_abstract_ipc=True``."""

    def __init__(self, request_address: str, reply_address: str, rank: int, *,
                 codec: Codec | None = None, options: ZmqOptions | None = None,
                 context: zmq.Context[zmq.Socket[bytes]] | None = None,
                 allow_insecure_tcp: bool = False, max_connections: int | None = 64,
                 allow_abstract_ipc: bool = False) -> None:
        super().__init__(rank, codec=codec, options=options, context=context)
        self.max_connections = max_connections
        self.request_address = request_address
        self.reply_address = reply_address
        check_bind_address(request_address, curve=False, allow_insecure_tcp=allow_insecure_tcp,
                           allow_abstract_ipc=allow_abstract_ipc)
        check_address(reply_address, curve=False, allow_insecure_tcp=allow_insecure_tcp,
                      allow_abstract_ipc=allow_abstract_ipc)
        check_pickle_allowed(self.codec, request_address, False)
        check_pickle_allowed(self.codec, reply_address, False)

    def _setup(self) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
        pull = self._socket(zmq.PULL)
        self.request_address = self._bind(pull, self.request_address)
        self._guard(pull, self.max_connections)
        push = self._socket(zmq.PUSH)
        connect_socket(push, self.reply_address)
        return pull, push

    def _beacon_socket(self) -> Callable[[], zmq.Socket[bytes]] | None:
        def make() -> zmq.Socket[bytes]:
            raw = self._new_beacon_socket(zmq.PUSH)
            raw.connect(self.reply_address)
            return raw

        return make


class ZmqPairEngineTransport(ZmqEngineBase):
    """An inproc PAIR connecting to the client's PAIR for this rank (same context)."""

    def __init__(self, address: str, rank: int, *,
                 context: zmq.Context[zmq.Socket[bytes]], codec: Codec | None = None,
                 options: ZmqOptions | None = None, allow_insecure_tcp: bool = False,
                 allow_abstract_ipc: bool = False) -> None:
        super().__init__(rank, codec=codec, options=options, context=context)
        self.address = address
        check_address(address, curve=False, allow_insecure_tcp=allow_insecure_tcp,
                      allow_abstract_ipc=allow_abstract_ipc)
        check_pickle_allowed(self.codec, address, False)

    def _setup(self) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
        raw = self._socket(zmq.PAIR)
        connect_socket(raw, self.address)
        return raw, raw
