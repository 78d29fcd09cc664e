"""Liveness and progress of an engine: what is running (read by the liveness
beacon's thread), :func:`report_progress` and its context variable, the status
heartbeat, the beacon's start and the in-band heartbeats."""

from __future__ import annotations

import contextvars
import secrets
import threading
import time
from collections.abc import Hashable

from ctlwire.kernel.core.peer_table import INCARNATION_TIME_SHIFT
from ctlwire.kernel.core.result_cache import RecordedOutcome
from ctlwire.kernel.engine_base import EngineBase
from ctlwire.transports.envelope import Heartbeat, Reply, Request
from ctlwire.transports.errors import (
    TransportError,
    WouldBlock,
)
from ctlwire.transports.transport import Route

__all__ = ["STEP_METHOD", "EngineLiveness", "current_request_id", "new_incarnation",
           "report_progress"]

STEP_METHOD = "(step)"
"""The method a heartbeat names while the engine's own step keeps it from polling."""

_current_request: contextvars.ContextVar[tuple[EngineLiveness, int] | None] = (
    contextvars.ContextVar("ctlwire_current_request", default=None))


def report_progress(fraction: float, note: str = "") -> bool:
    """Report the progress of the request the calling handler is running
    (``fraction`` in 0..1, and a short note); the caller sees it with its next
    heartbeat, while the handler still blocks. Callable from sync, threaded
    and async handlers. False (nothing reported) outside a handler."""
    current = _current_request.get()
    if current is None:
        return False
    endpoint, request_id = current
    return endpoint.report_progress(request_id, fraction, note)


def current_request_id() -> int | None:
    """The id of the request the calling handler is running (sync, threaded or
    async handlers); None outside a handler."""
    current = _current_request.get()
    return None if current is None else current[1]


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


class EngineLiveness(EngineBase):
    """The liveness part of an endpoint (see the module docstring)."""

    loops: int
    _hb_seq: int
    _next_heartbeat: float
    heartbeats_paused: bool
    use_beacon: bool
    beacon_active: bool
    shared_heartbeats: bool
    """Heartbeats reach every peer (a routed transport), not only a request's sender."""
    _running_routes: dict[int, Route]
    key_scope: str
    _io_thread: int | None  # the thread that uses the transport (serve's or poll's)
    _next_progress_send: float

    # -- what is running (read by the beacon's thread) ---------------------------
    def _begin(self, req: Request, route: Route
               ) -> contextvars.Token[tuple[EngineLiveness, int] | None]:
        """An admitted request starts running (its key, if any, was recorded as
        running by admission)."""
        self.running[req.id] = (req.method, time.monotonic())
        if self.shared_heartbeats:
            self._running_routes[req.id] = route
        return _current_request.set((self, req.id))

    def _end(self, req: Request, route: Route, reply: Reply | None,
             token: contextvars.Token[tuple[EngineLiveness, int] | None]) -> None:
        """It ended: with ``reply``, recorded under its key; with None (cancelled,
        no outcome), its key is forgotten so that a retry runs."""
        _current_request.reset(token)
        self.running.pop(req.id, None)
        self._progress.pop(req.id, None)
        if self._running_routes:
            self._running_routes.pop(req.id, None)
        self._last_loop = time.monotonic()
        if req.key:
            if reply is None:
                self.results.abandon(self._key_scope(route, req), req.method, req.key)
            else:
                self.results.finish(self._key_scope(route, req), req.method, req.key,
                                    RecordedOutcome(reply.ok, bytes(reply.result), reply.error),
                                    self.clock())

    def _key_scope(self, route: Route, req: Request) -> Hashable:
        """Whose idempotency keys ``req``'s key is among: its route's (the
        connection it came from); the client incarnation it claims with
        ``key_scope="client"`` (survives reconnects; trusts every peer) or where
        the transport has no routes to tell peers apart (a DEALER engine's one
        client, a PULL engine's senders)."""
        if route is None or self.key_scope == "client":
            return ("client", req.client)
        return route

    def report_progress(self, request_id: int, fraction: float, note: str = "") -> bool:
        """Record the progress of running request ``request_id`` (see
        :func:`report_progress`); False when it is not running."""
        if request_id not in self.running:
            return False
        self._progress[request_id] = (min(1.0, max(0.0, float(fraction))), str(note)[:200])
        if self._running_routes and threading.get_ident() == self._io_thread:
            # a handler on the transport's own thread (it may block that thread):
            # its sender hears now, at most once an interval
            now = time.monotonic()
            if now >= self._next_progress_send:
                self._next_progress_send = now + (self.heartbeat_interval or 0.25)
                self.send_progress_heartbeats()
        return True

    def loop_came_round(self) -> None:
        """The engine's loop made progress (called by :meth:`poll` and :meth:`serve`)."""
        self.loops += 1
        self._last_loop = time.monotonic()

    def status_heartbeat(self) -> Heartbeat | None:
        """This engine's next heartbeat: who it is and what it is doing. Safe to
        call from the beacon's thread (reads only). None while
        :attr:`heartbeats_paused`.

        With :attr:`shared_heartbeats` (a transport whose heartbeats reach every
        peer, such as a ROUTER engine's PUB beacon) it says only what liveness
        needs -- busy or idle, the method and for how long -- and nothing that
        names a request (no id, no handler progress); the sender of a running
        request gets those in-band (:meth:`send_progress_heartbeats`)."""
        if self.heartbeats_paused:
            return None
        self._hb_seq += 1
        now = time.monotonic()
        try:
            running = list(self.running.items())
        except RuntimeError:  # pragma: no cover - changed size while copied
            running = []
        if running:
            rid, (method, since) = min(running, key=lambda item: item[1][1])
            if self.shared_heartbeats:
                return Heartbeat(self.rank, self.incarnation, self._hb_seq, 0, method,
                                 now - since, self.loops)
            fraction, note = self._progress.get(rid, (-1.0, ""))
            return Heartbeat(self.rank, self.incarnation, self._hb_seq, rid, method,
                             now - since, self.loops, fraction, note)
        idle_for = now - self._last_loop
        if self.heartbeat_interval and idle_for > 2 * self.heartbeat_interval and \
                self._polling:
            # a sync engine that has not polled for two intervals is in its own step
            return Heartbeat(self.rank, self.incarnation, self._hb_seq, 0, STEP_METHOD,
                             idle_for, self.loops)
        return Heartbeat(self.rank, self.incarnation, self._hb_seq, 0, "", 0.0, self.loops)

    def _start_beacon(self) -> None:
        start = getattr(self.transport, "start_beacon", None)
        if self.use_beacon and self.heartbeat_interval and start is not None:
            self.beacon_active = bool(start(self.heartbeat_interval, self.status_heartbeat))

    def _heartbeat_if_due(self) -> None:
        if not self.heartbeat_interval or self.beacon_active:
            return
        now = time.monotonic()
        if now < self._next_heartbeat:
            return
        self._next_heartbeat = now + self.heartbeat_interval
        self.send_heartbeat()

    def send_progress_heartbeats(self) -> None:
        """With :attr:`shared_heartbeats`: tell each running request's sender, on
        its own route, what that request is doing (its id and its handler's
        progress). Nothing to send is a no-op; a full route misses one."""
        routes = self._running_routes
        if not routes or self.heartbeats_paused:
            return
        now = time.monotonic()
        for rid, route in list(routes.items()):
            entry = self.running.get(rid)
            if entry is None:
                continue
            method, since = entry
            fraction, note = self._progress.get(rid, (-1.0, ""))
            hb = Heartbeat(self.rank, self.incarnation, self._hb_seq, rid, method,
                           now - since, self.loops, fraction, note)
            try:
                self.transport.send_nowait(route, hb)
                self.counters["heartbeats_sent"] += 1
            except (WouldBlock, TransportError):
                pass

    def send_heartbeat(self) -> None:
        """Announce this rank and incarnation to every client route now
        (nothing while :attr:`heartbeats_paused`, a hook for fault tests)."""
        hb = self.status_heartbeat()
        if hb is None:
            return
        for route in list(self.transport.heartbeat_routes()):
            try:
                self.transport.send_nowait(route, hb)
                self.counters["heartbeats_sent"] += 1
            except (WouldBlock, TransportError):
                pass
