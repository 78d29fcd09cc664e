"""Liveness and progress of an engine: what is running (read by the liveness
beacon's thread), :func:`report_progress` and its context variable, the status
heartbeat, the beacon's start and the in-band heartbeats."""

from __future__ import annotations

import contextvars
import secrets
import threading
import time

from ctlwire.kernel.core.result_cache import RecordedOutcome
from ctlwire.kernel.engine_base import EngineBase
from ctlwire.transports.envelope import Heartbeat, Reply, Request
from ctlwire.transports.errors import (
    TransportError,
    WouldBlock,
)

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
    a heartbeat of an older, replaced process from one of a newer process.
    Within one process every incarnation is larger than the one minted before
    it, even in the same millisecond (an endpoint restarted at once must not
    look older than the one it replaces).
    """
    global _last_incarnation
    with _incarnation_lock:
        minted = (time.time_ns() // 1_000_000) << 12 | secrets.randbits(12)
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

    # -- what is running (read by the beacon's thread) ---------------------------
    def _begin(self, req: Request) -> contextvars.Token[tuple[EngineLiveness, int] | None]:
        self.running[req.id] = (req.method, time.monotonic())
        if req.key:
            self.results.start(req.method, req.key)
        return _current_request.set((self, req.id))

    def _end(self, req: Request, reply: Reply | None,
             token: contextvars.Token[tuple[EngineLiveness, int] | None]) -> None:
        _current_request.reset(token)
        self.running.pop(req.id, None)
        self._progress.pop(req.id, None)
        self._last_loop = time.monotonic()
        if req.key:
            if reply is None:
                self.results.abandon(req.method, req.key)
            else:
                self.results.finish(req.method, req.key,
                                    RecordedOutcome(reply.ok, bytes(reply.result), reply.error))

    def report_progress(self, request_id: int, fraction: float, note: str = "") -> bool:
        """Record the progress of running request ``request_id`` (see
        :func:`report_progress`); False when it is not running."""
        if request_id not in self.running:
            return False
        self._progress[request_id] = (min(1.0, max(0.0, float(fraction))), str(note)[:200])
        return True

    def loop_came_round(self) -> None:
        """The engine's loop made progress (called by :meth:`poll` and :meth:`serve`)."""
        self.loops += 1
        self._last_loop = time.monotonic()

    def status_heartbeat(self) -> Heartbeat | None:
        """This engine's next heartbeat: who it is and what it is doing. Safe to
        call from the beacon's thread (reads only). None while
        :attr:`heartbeats_paused`."""
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
