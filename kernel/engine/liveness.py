"""An engine's liveness and progress: what is running (read by the liveness
beacon's thread), :func:`report_progress`, the status heartbeat, the beacon's
start and the in-band heartbeats.

Guarantees: a heartbeat says who the engine is (rank, incarnation) and what it
is doing; on a transport whose heartbeats reach every peer
(``shared_heartbeats``) it names no request -- a running request's id and
progress go only to the route that sent it, and :meth:`EngineLiveness.visible_running`
shows a handler only its own route's. A sync engine that has not polled
for two intervals is reported busy in :data:`STEP_METHOD`. A heartbeat that
cannot be sent is skipped (the next one follows an interval later); one whose
send raised anything else is skipped too, counted (:attr:`EngineLiveness.heartbeat_failures`)
and logged (rate-limited): it never ends the engine's loop.
"""

from __future__ import annotations

import contextvars
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable, Hashable

from ctlwire.kernel.core.peer_table import INCARNATION_TIME_SHIFT
from ctlwire.transports.envelope import Heartbeat
from ctlwire.transports.errors import TransportError, WouldBlock
from ctlwire.transports.rate_limited_log import RateLimitedLog
from ctlwire.transports.transport import EngineTransport, Route

__all__ = ["STEP_METHOD", "EngineLiveness", "current_peer", "current_rank",
           "current_request_id", "new_incarnation", "report_progress"]

STEP_METHOD = "(step)"
"""The method a heartbeat names while the engine's own step keeps it from polling."""

# the request the calling handler runs: its engine's liveness, its id, its route and
# its ``client`` field
_current_request: contextvars.ContextVar[tuple[EngineLiveness, int, Route, int] | None] = (
    contextvars.ContextVar("ctlwire_current_request", default=None))

RunningToken = contextvars.Token[tuple["EngineLiveness", int, Route, int] | None]


def report_progress(fraction: float, note: str = "") -> bool:
    """Report the progress of the request the calling handler is running
    (``fraction`` in 0..1, and a short note); the caller sees it with its next
    heartbeat, while the handler still blocks. Callable from sync, threaded
    and async handlers. False (nothing reported) outside a handler."""
    current = _current_request.get()
    if current is None:
        return False
    endpoint, request_id, _, _ = current
    return endpoint.report_progress(request_id, fraction, note)


def current_request_id() -> int | None:
    """The id of the request the calling handler is running (sync, threaded or
    async handlers); None outside a handler."""
    current = _current_request.get()
    return None if current is None else current[1]


def current_rank() -> int | None:
    """The rank of the engine whose handler is calling (sync, threaded or async
    handlers); None outside a handler."""
    current = _current_request.get()
    return None if current is None else current[0].rank


def current_peer() -> Hashable | None:
    """Who sent the request the calling handler runs, as no other peer can claim:
    its connection (or the key its transport names for it), never the ``client``
    field it carries; on a transport without routes (one client) that field
    (:meth:`~ctlwire.kernel.core.inbound_core.InboundCore.peer`). None outside a
    handler."""
    current = _current_request.get()
    if current is None:
        return None
    live, _, route, client = current
    return live.peer_of(route, client)


_incarnation_lock = threading.Lock()
_last_incarnation = 0


def new_incarnation() -> int:
    """An engine incarnation: milliseconds since the epoch, then 12 random bits.

    Later processes get larger numbers (clocks permitting), so a client can tell
    a heartbeat of an older, replaced process from one of a newer process; a
    client refuses one minted further ahead of its own clock than its
    ``incarnation_window`` (``PeerTable.plausible``).
    Within one process every incarnation is larger than the one minted before
    it, even in the same millisecond (an endpoint restarted at once must not
    look older than the one it replaces).
    """
    global _last_incarnation
    with _incarnation_lock:
        minted = ((time.time_ns() // 1_000_000) << INCARNATION_TIME_SHIFT
                  | secrets.randbits(INCARNATION_TIME_SHIFT))
        _last_incarnation = max(minted, _last_incarnation + 1)
        return _last_incarnation


class EngineLiveness:
    """What an engine is doing, and the heartbeats that say it; see the module docstring."""

    def __init__(self, transport: EngineTransport, *, rank: int, incarnation: int,
                 heartbeat_interval: float | None = 0.25, beacon: bool = True,
                 peer_of: Callable[[Route, int], Hashable] | None = None) -> None:
        self.transport = transport
        #: who sent a request, from its route and ``client`` field (:func:`current_peer`)
        self.peer_of: Callable[[Route, int], Hashable] = peer_of or _route_or_client
        self.rank = rank
        self.incarnation = incarnation
        self.heartbeat_interval = heartbeat_interval
        self.use_beacon = beacon
        self.beacon_active = False
        #: heartbeats reach every peer (a routed transport), not only a request's sender
        self.shared_heartbeats = transport.routed
        #: a hook for fault tests: no heartbeat goes out while set
        self.paused = False
        #: requests being handled now: request id -> (method, time.monotonic() at start)
        self.running: dict[int, tuple[str, float]] = {}
        #: handler-reported progress: request id -> (fraction, note)
        self.progress: dict[int, tuple[float, str]] = {}
        self.loops = 0
        self.last_loop = time.monotonic()
        #: a sync engine (poll): a long gap between loops is its own step
        self.polling = False
        #: the thread that uses the transport (serve's or poll's)
        self.io_thread: int | None = None
        self.heartbeats_sent = 0
        #: heartbeats whose send raised an unexpected error (skipped, logged)
        self.heartbeat_failures = 0
        self._failure_log = RateLimitedLog(logging.getLogger("ctlwire.engine"))
        self._next_upkeep = 0.0
        self._routes: dict[int, Route] = {}  # shared_heartbeats: a running request's route
        self._seq = 0
        self._next_heartbeat = 0.0
        self._next_progress_send = 0.0

    # -- what is running (read by the beacon's thread) ---------------------------
    def begin(self, request_id: int, method: str, route: Route, client: int = 0
              ) -> RunningToken:
        """A request (its id, method, route and ``client`` field) starts running
        (on this thread or task)."""
        self.running[request_id] = (method, time.monotonic())
        if self.shared_heartbeats:
            self._routes[request_id] = route
        return _current_request.set((self, request_id, route, client))

    def end(self, request_id: int, token: RunningToken) -> None:
        """It ended, with or without an outcome."""
        _current_request.reset(token)
        self.running.pop(request_id, None)
        if self.progress:
            self.progress.pop(request_id, None)
        if self._routes:
            self._routes.pop(request_id, None)

    def visible_running(self) -> dict[int, str]:
        """Running request ids and their methods, as the calling handler may see
        them: only those its own route sent on a transport shared by several
        clients (``shared_heartbeats``), so no peer reads another's ids; all of
        them outside a handler (the engine's own code) or where every request
        comes from the one client the engine dialed."""
        try:
            running = list(self.running.items())
        except RuntimeError:  # pragma: no cover - changed size while copied
            running = []
        current = _current_request.get()
        if current is None or not self.shared_heartbeats:
            return {rid: method for rid, (method, _) in running}
        caller = current[2]
        routes = self._routes
        return {rid: method for rid, (method, _) in running if routes.get(rid) == caller}

    def report_progress(self, request_id: int, fraction: float, note: str = "") -> bool:
        """Record the progress of running request ``request_id`` (see
        :func:`report_progress`); False when it is not running."""
        if request_id not in self.running:
            return False
        self.progress[request_id] = (min(1.0, max(0.0, float(fraction))), str(note)[:200])
        if self._routes and threading.get_ident() == self.io_thread:
            # a handler on the transport's own thread (it may block that thread):
            # its sender hears now, at most once an interval
            now = time.monotonic()
            if now >= self._next_progress_send:
                self._next_progress_send = now + (self.heartbeat_interval or 0.25)
                self.send_progress_heartbeats()
        return True

    def loop_came_round(self, now: float | None = None) -> None:
        """The engine's loop made progress (``now``: ``time.monotonic()`` if read);
        a poll loop's (:attr:`polling`) in-band heartbeat goes out if due, and the
        transport's upkeep runs once an interval (on the loop's own thread)."""
        self.loops += 1
        self.last_loop = now = time.monotonic() if now is None else now
        if now >= self._next_heartbeat and self.polling:
            self.heartbeat_if_due(now)
        if now >= self._next_upkeep:
            self._next_upkeep = now + (self.heartbeat_interval or 0.25)
            try:
                self.transport.upkeep()
            except Exception as exc:  # never let upkeep end the engine's loop
                self._failure_log.warning(type(exc).__name__, "engine %d: upkeep failed: %r",
                                          self.rank, exc)

    # -- heartbeats ----------------------------------------------------------------
    def status_heartbeat(self) -> Heartbeat | None:
        """This engine's next heartbeat; safe to call from the beacon's thread
        (reads only). None while :attr:`paused`."""
        if self.paused:
            return None
        self._seq += 1
        now = time.monotonic()
        try:
            running = list(self.running.items())
        except RuntimeError:  # pragma: no cover - changed size while copied
            running = []
        if running:
            rid, (method, since) = min(running, key=lambda item: item[1][1])
            if self.shared_heartbeats:
                return Heartbeat(self.rank, self.incarnation, self._seq, 0, method,
                                 now - since, self.loops)
            fraction, note = self.progress.get(rid, (-1.0, ""))
            return Heartbeat(self.rank, self.incarnation, self._seq, rid, method,
                             now - since, self.loops, fraction, note)
        idle_for = now - self.last_loop
        if self.heartbeat_interval and idle_for > 2 * self.heartbeat_interval and self.polling:
            return Heartbeat(self.rank, self.incarnation, self._seq, 0, STEP_METHOD,
                             idle_for, self.loops)
        return Heartbeat(self.rank, self.incarnation, self._seq, 0, "", 0.0, self.loops)

    def start_beacon(self) -> None:
        """Start the transport's liveness beacon, where it has one."""
        if self.use_beacon and self.heartbeat_interval:
            self.beacon_active = self.transport.start_beacon(self.heartbeat_interval,
                                                             self.status_heartbeat)

    def use_shared_beacon(self) -> None:
        """Another beacon (:func:`~ctlwire.kernel.engine.shared_beacon.start_shared_beacon`)
        sends this engine's :meth:`status_heartbeat`: no beacon of its own, no in-band
        heartbeats."""
        self.use_beacon = False
        self.beacon_active = True
        self._next_heartbeat = math.inf

    def heartbeat_if_due(self, now: float) -> None:
        """In-band heartbeats (no beacon): one every interval (``now``: monotonic)."""
        if not self.heartbeat_interval or self.beacon_active:
            self._next_heartbeat = math.inf  # none due, ever: the beacon sends them
            return
        if now < self._next_heartbeat:
            return
        self._next_heartbeat = now + self.heartbeat_interval
        self.send_heartbeat()

    def send_heartbeat(self) -> None:
        """Announce this rank and incarnation to every client route now."""
        hb = self.status_heartbeat()
        if hb is None:
            return
        for route in list(self.transport.heartbeat_routes()):
            self._send(route, hb)

    def send_progress_heartbeats(self) -> None:
        """With :attr:`shared_heartbeats`: tell each running request's sender, on
        its own route, what that request is doing (its id and its handler's
        progress). A full route misses one."""
        if not self._routes or self.paused:
            return
        now = time.monotonic()
        for rid, route in list(self._routes.items()):
            entry = self.running.get(rid)
            if entry is None:
                continue
            method, since = entry
            fraction, note = self.progress.get(rid, (-1.0, ""))
            self._send(route, Heartbeat(self.rank, self.incarnation, self._seq, rid, method,
                                        now - since, self.loops, fraction, note))

    def _send(self, route: Route, hb: Heartbeat) -> None:
        try:
            self.transport.send_nowait(route, hb)
            self.heartbeats_sent += 1
        except (WouldBlock, TransportError):
            pass
        except Exception as exc:  # never let a heartbeat end the engine's loop
            self.heartbeat_failures += 1
            self._failure_log.warning(type(exc).__name__, "engine %d: heartbeat not sent: %r",
                                      self.rank, exc)


def _route_or_client(route: Route, client: int) -> Hashable:
    """A request's peer without an inbound core: its route, else its ``client`` field."""
    return ("client", client) if route is None else route
