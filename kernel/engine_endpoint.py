"""The engine side: an allow-list of control methods, served over an EngineTransport.

::

    endpoint = EngineEndpoint(transport, rank=0)

    @endpoint.method()
    def update_weights(req: UpdateWeights) -> int:   # payload validated as UpdateWeights
        ...

    await endpoint.serve()        # an async engine, or:
    endpoint.poll()               # between steps of a synchronous busy loop

Guarantees:

* **Allow-list dispatch.** Only registered methods run; a request for any other
  name is Rejected with ``UnknownMethod``. Nothing is looked up by ``getattr``.
* **Validated payloads.** A handler's payload is decoded as the type its
  parameter declares (msgspec); a mismatch is Rejected with ``InvalidPayload``
  and the handler never sees it.
* **Deadlines.** A request whose deadline has already passed is Expired with
  ``DeadlineExpired`` and not run.
* **Ordering.** Every request moves through the ``InboundRequest`` table
  (Received → Running → Replied, or Rejected / Expired) and gets exactly one
  reply; a handler that raises gets an error reply carrying its class name,
  message and ``code`` attribute. With :meth:`poll` (sync handlers) requests
  run one at a time in arrival order. With :meth:`serve`, requests are taken
  in arrival order; sync inline handlers run one at a time on the event loop,
  while async and ``threaded`` handlers run in a lane per method: **per
  method, requests start in arrival order, at most ``concurrency`` at a time
  (default 1, so each method stays serial)**, and different methods run
  concurrently — ``get_server_info`` is answered while a long
  ``update_weights`` runs, and a hung handler blocks only its own method.
  Across methods there is no ordering. The deadline is checked when a request
  starts, not when it is queued. :attr:`EngineEndpoint.running` maps each
  request id being handled to its method and start time (``time.monotonic``).
* **At most once.** A request id already seen on the same route (a
  duplicated frame) is dropped and counted, never run twice. Ids are
  remembered per route (the connection a frame came from, not the client id
  it claims), so no other connection can make a legitimate request look like
  a duplicate (:class:`~ctlwire.kernel.core.duplicate_filter.DuplicateFilter`).
* **Bad input is answered or counted, never fatal.** Malformed and oversized
  frames are answered with a typed error when their id can be read, else
  counted; nothing in the receive path can end the endpoint.
* **Liveness that does not depend on the handler's thread.** Heartbeats go
  out every ``heartbeat_interval`` from the transport's liveness beacon (a
  thread and a socket of their own, see :mod:`ctlwire.transports.zmq_beacon`),
  so a sync handler or step may block for minutes and the rank stays alive.
  Transports without a beacon (in-memory, inproc PAIR, fault-injecting
  wrappers) get in-band heartbeats from :meth:`serve`'s task or :meth:`poll`.
* **Progress.** Each heartbeat says what the engine is doing: the request
  running (id, method, seconds so far), loop iterations, and what the handler
  reported with :func:`report_progress`. A step that keeps :meth:`poll` from
  being called for more than an interval is reported as method ``"(step)"``.
* **Idempotency keys.** A request with a key (``Request.key``) whose
  ``(route, method, key)`` already ran is answered with the first run's
  outcome, result or error (:class:`~ctlwire.kernel.core.result_cache.ResultCache`);
  the handler runs once. A key longer than the cache's ``max_key_bytes`` is
  refused with ``KeyTooLong`` (414); a new key that does not fit the cache's
  byte budget without evicting an entry inside its retry window is refused
  with ``CacheFull`` (507) and not run. Keys are scoped by route by default,
  so no other connection can read or pre-empt them; a client whose connection
  was re-established has a new route, and a retry over it runs again. With
  ``key_scope="client"`` keys are scoped by the client incarnation a request
  claims instead: retries survive reconnects, and every peer that can reach
  the engine is trusted not to claim another client's incarnation. A
  transport without routes (a DEALER engine, a PULL engine) is always scoped
  that way: it cannot tell its senders apart.
* **Fencing.** A fencing token is microseconds since the epoch. A request
  whose token is lower than the highest this engine has accepted is refused
  with ``Fenced`` (409); one that is negative or more than ``fence_window``
  seconds ahead of the engine's clock with ``FenceOutOfRange`` (416); neither
  runs. Only a fully validated request of a state-changing method moves the
  fence (:class:`~ctlwire.kernel.core.fence_guard.FenceGuard`).
* **Read-only methods** (``read_only=True``, and the built-in
  ``ctlwire.metrics``) ignore fences and idempotency keys.
* **Heartbeats that reach every peer name no request.** On a routed
  transport (a ROUTER engine and its PUB beacon) a heartbeat says busy or
  idle, the method and for how long; the id and progress of a running request
  go only to the route that sent it (in-band, from :meth:`serve`'s heartbeat
  task, so while an async or threaded handler runs).
* **A client that does not read cannot stall the others.** Replies that find
  their client's pipe full wait in a queue of that client's route only,
  bounded per route (``max_unread_replies``, ``max_unread_bytes``) and in
  total (``max_outbox_bytes``); beyond, a reply is dropped and counted
  (``replies_dropped_unread``). :meth:`poll` flushes every route's queue, at
  its start and after its batch, without letting a full one hold up the rest;
  a poll loop waits at most 5 ms for input while replies wait
  (:meth:`idle_wait`). Under :meth:`serve` a reply
  waits at most ``reply_send_timeout`` for room; a route that timed out is
  marked stalled and further replies to it are dropped at once (counted)
  until it takes one again, so the dispatcher keeps serving other clients.
* **What peers send is bounded in bytes.** Under :meth:`serve`, requests taken
  and not yet started hold at most ``max_queued_request_bytes`` (plus one
  request): beyond, the engine takes no more until some start, and libzmq's
  byte-sized high-water marks hold the rest (see
  :class:`~ctlwire.transports.zmq_config.ZmqOptions`).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Literal

from ctlwire.kernel.builtin_methods import ENGINE_METRICS_METHOD
from ctlwire.kernel.core.duplicate_filter import DuplicateFilter
from ctlwire.kernel.core.fence_guard import DEFAULT_FENCE_WINDOW, FenceGuard
from ctlwire.kernel.core.result_cache import ResultCache
from ctlwire.kernel.engine_admission import _BadFrameReply, _Inbound
from ctlwire.kernel.engine_base import log
from ctlwire.kernel.engine_liveness import STEP_METHOD, new_incarnation, report_progress
from ctlwire.kernel.engine_registry import _NONE, ErrorCode, MethodSpec
from ctlwire.kernel.engine_serve import EngineServing, QueuedRequestBytes
from ctlwire.kernel.tracing import current_trace
from ctlwire.states import InboundState
from ctlwire.transports.envelope import Reply, Request
from ctlwire.transports.errors import TransportClosed, TransportError, Unroutable, WouldBlock
from ctlwire.transports.rate_limited_log import RateLimitedLog
from ctlwire.transports.transport import EngineTransport, Received, Route

# EngineEndpoint is composed of parts, one module each (see engine_base); the
# names below are re-exported from there (this module is their documented home).
__all__ = ["STEP_METHOD", "EngineEndpoint", "ErrorCode", "MethodSpec", "new_incarnation",
           "report_progress"]

#: the longest a poll loop waits for input while replies wait for room
_OUTBOX_RETRY = 0.005

_ENGINE_DROPS = ("duplicates", "dropped_malformed", "dropped_oversized", "dropped_framing",
                 "dropped_wrong_type", "reply_send_failures", "replies_too_large")


class EngineEndpoint(EngineServing):
    """Serves registered control methods for one engine rank; see the module docstring."""

    def __init__(
        self,
        transport: EngineTransport,
        *,
        rank: int | None = None,
        incarnation: int | None = None,
        heartbeat_interval: float | None = 0.25,
        mailbox_size: int = 256,
        dedup_window: int = 4096,
        dedup_peers: int = 64,
        fence_window: float = DEFAULT_FENCE_WINDOW,
        key_scope: Literal["route", "client"] = "route",
        clock: Callable[[], float] = time.time,
        beacon: bool = True,
        result_cache: ResultCache | None = None,
        max_unread_replies: int = 1024,
        max_unread_bytes: int = 4 << 20,
        max_outbox_bytes: int = 32 << 20,
        reply_send_timeout: float = 1.0,
        max_queued_request_bytes: int = 64 << 20,
    ) -> None:
        self.transport = transport
        self.codec = transport.codec
        self.rank = transport.rank if rank is None else rank
        self.incarnation = incarnation or new_incarnation()
        self.heartbeat_interval = heartbeat_interval
        self.mailbox_size = mailbox_size
        self.clock = clock
        self._methods: dict[str, MethodSpec] = {}
        # sync inline methods whose payloads the codec can take on its hot path:
        # name -> (spec, encode a result, decode a payload as the spec's type)
        self._fast: dict[str, tuple[MethodSpec, Callable[[Any], bytes],
                                    Callable[[Any], Any]]] = {}
        self.duplicates = DuplicateFilter(dedup_window, dedup_peers)
        self.fences = FenceGuard(fence_window)
        self._hb_seq = 0
        self._next_heartbeat = 0.0
        # replies waiting for room, per route (poll mode): route -> queue of (reply, size)
        self._outbox: OrderedDict[Route, deque[tuple[Reply | bytes, int]]] = OrderedDict()
        self._outbox_route_bytes: dict[Route, int] = {}
        self._outbox_bytes = 0
        self.max_unread_replies = max_unread_replies
        self.max_unread_bytes = max_unread_bytes
        self.max_outbox_bytes = max_outbox_bytes
        self.reply_send_timeout = reply_send_timeout
        # serve mode: routes whose last reply timed out waiting for room
        self._stalled: OrderedDict[Route, None] = OrderedDict()
        self.outbox_peak_bytes = 0
        #: replies that could not be sent: one line per kind of failure per interval
        self.unsent_log = RateLimitedLog(log)
        #: serve mode: bytes of requests taken and not started, against their budget
        self.queued_requests = QueuedRequestBytes(max_queued_request_bytes)
        self.heartbeats_paused = False
        self.use_beacon = beacon
        self.beacon_active = False
        self.shared_heartbeats = bool(getattr(transport, "routed", False))
        self._running_routes: dict[int, Route] = {}
        self._io_thread: int | None = None
        self._next_progress_send = 0.0
        self._opened = False
        self._closed = False
        self.client_last_seen: float | None = None
        # what the engine is doing, read by the beacon's thread: request id ->
        # (method, monotonic start); handler-reported progress; loop iterations
        #: requests being handled now: request id -> (method, time.monotonic() at start)
        self.running: dict[int, tuple[str, float]] = {}
        self._progress: dict[int, tuple[float, str]] = {}
        self.loops = 0
        self._last_loop = time.monotonic()
        self.results = result_cache if result_cache is not None else ResultCache()
        if key_scope not in ("route", "client"):
            raise ValueError(f"key_scope must be 'route' or 'client', not {key_scope!r}")
        self.key_scope = key_scope
        self._polling = False
        self._nil = self.codec.encode_value(None)
        # the reply hot path: encode with the codec's own encoder, check the size,
        # send the bytes -- when the transport takes encoded envelopes (the ZMQ
        # engine transports) and the codec has that encoder; else send_nowait
        send_encoded = getattr(transport, "send_encoded_nowait", None)
        encoder = self.codec.fast_envelope_encoder() if send_encoded is not None else None
        self._encode_envelope = None
        self._send_encoded = _no_encoded_send
        if send_encoded is not None and encoder is not None:
            self._encode_envelope, self._send_encoded = encoder, send_encoded
        self._ok_reply: Callable[[int, bytes], bytes] | None = None
        self._max_reply_size = self.codec.max_message_size
        self._set_ok_reply()
        # poll(): every event that can be received now, in one call where the
        # transport can (the ZMQ engine transports), else try_receive in a loop
        ready = getattr(transport, "receive_ready", None)
        self._take_ready: Callable[[int], list[Any]] = (
            ready if ready is not None else self._try_receive_many)
        #: the first event of a poll, on its own (None: nothing queued)
        self._take_one: Callable[[], Any] = (getattr(transport, "receive_one", None)
                                             or self._take_one_of_many)
        self.counters: dict[str, int] = {
            "received": 0,
            "replied": 0,
            "rejected": 0,
            "expired": 0,
            "handler_errors": 0,
            "duplicates": 0,
            "dropped_malformed": 0,
            "dropped_oversized": 0,
            "dropped_framing": 0,
            "dropped_wrong_type": 0,
            "error_replies_for_bad_frames": 0,
            "reply_send_failures": 0,
            "replies_dropped_unread": 0,
            "replies_too_large": 0,
            "heartbeats_sent": 0,
            "heartbeats_received": 0,
            "internal_errors": 0,
            "fenced": 0,
            "fence_out_of_range": 0,
            "idempotent_replays": 0,
            "idempotent_in_progress": 0,
            "idempotency_key_too_long": 0,
            "idempotency_cache_full": 0,
        }
        self.states: dict[InboundState, int] = {s: 0 for s in InboundState}
        # built in, read-only, allow-listed like any method: what metrics() returns
        self.register(ENGINE_METRICS_METHOD, self.metrics, payload_type=None, read_only=True)
        self._builtin = frozenset(self._methods)

    # -- synchronous embedding -------------------------------------------------
    def open(self) -> None:
        """Open the transport (sync engines), start the liveness beacon where the
        transport has one, and send the first heartbeat. Idempotent;
        :meth:`poll` calls it when it was not called."""
        self.transport.open()
        if not self._opened:
            self._set_ok_reply()  # rank and incarnation are fixed from here on
            self._opened = True
            self._polling = True
            self._io_thread = threading.get_ident()
            self._last_loop = time.monotonic()
            self._start_beacon()
            self._next_heartbeat = 0.0
            self._heartbeat_if_due()

    def close(self) -> None:
        self._closed = True
        self.transport.close()

    def poll(self, max_messages: int = 64) -> int:
        """Handle up to ``max_messages`` ready requests without blocking; send a
        heartbeat if one is due. Returns how many requests were handled.
        Sync handlers only (an async handler gets an error reply).

        The first ``poll()`` opens the endpoint (:meth:`open`) if that was not
        done yet, so a loop of ``poll()`` alone serves requests; after
        :meth:`close` it raises TransportClosed instead of returning 0 for ever.
        """
        if self._closed:
            raise TransportClosed(f"engine {self.rank}: poll() after close()")
        if not self._opened:
            self.open()
        # loop_came_round() and the heartbeat's due check, on one clock read
        now = time.monotonic()
        self.loops += 1
        self._last_loop = now
        if now >= self._next_heartbeat:
            self._heartbeat_if_due()
        if self._outbox:
            self._flush_outbox()
        # The first event is taken and handled on its own, the rest after it in one
        # batch that ends with a receive finding the queue empty (a zmq.Again): that
        # miss must not delay the reply to a lone request (the common case of a
        # sequential caller), only follow it. It is not skipped, though: an EVENTS
        # probe instead (cheaper in CPU) let the engine go back to waiting right
        # after its reply, and the sequential round trip measured ~9 % slower with
        # it.
        if max_messages < 1:
            return 0
        try:
            event = self._take_one()
        except TransportClosed:
            return 0
        if event is None:
            return 0
        handled = self._handle_event(event)
        if max_messages > 1:
            try:
                events = self._take_ready(max_messages - 1)
            except TransportClosed:
                return handled
            for event in events:
                handled += self._handle_event(event)
        if self._outbox:  # a burst's replies that found the pipe full: room now, likely
            self._flush_outbox()
        return handled

    def idle_wait(self, timeout: float) -> float:
        """How long a poll loop may block waiting for input: ``timeout``, or at most
        5 ms while replies wait in the outbox for room (they go out on the next
        :meth:`poll`)."""
        return min(timeout, _OUTBOX_RETRY) if self._outbox else timeout

    def _handle_event(self, event: Any) -> int:
        """Handle one event received by :meth:`poll`; 1 when it was a request handled."""
        try:
            if type(event) is Received and type(event.envelope) is Request:
                return self._handle_request_sync(event.envelope, event.route)
            return self._handle_sync(event)
        except Exception:  # pragma: no cover - never let one frame end the loop
            self.counters["internal_errors"] += 1
            log.exception("engine %d: internal error handling %r", self.rank, event)
            return 0

    def _take_one_of_many(self) -> Any:
        """``receive_one`` of a transport that has none: the first of ``_take_ready(1)``."""
        events = self._take_ready(1)
        return events[0] if events else None

    def _try_receive_many(self, limit: int) -> list[Any]:
        """``receive_ready`` of a transport that has none: try_receive in a loop."""
        events: list[Any] = []
        try_receive = self.transport.try_receive
        while len(events) < limit:
            try:
                event = try_receive()
            except TransportClosed:
                if not events:
                    raise
                break
            if event is None:
                break
            events.append(event)
        return events

    def run_blocking(self, stop: threading.Event | None = None, *,
                     step: Callable[[], None] | None = None, idle_wait: float | None = None
                     ) -> None:
        """A synchronous engine loop: ``step()`` (your work), then :meth:`poll`,
        blocking up to ``idle_wait`` seconds for input when there is no
        ``step``. Runs until ``stop`` is set."""
        wait = idle_wait if idle_wait is not None else (self.heartbeat_interval or 0.25) / 2
        self.open()
        try:
            while stop is None or not stop.is_set():
                if step is not None:
                    step()
                self.poll()
                if step is None:
                    # returns at once if more input is queued (level-triggered)
                    self.transport.wait_readable(self.idle_wait(wait))
        finally:
            self.close()

    def _handle_request_sync(self, req: Request, route: Route) -> int:
        """Poll mode: one received request, on the fast path when it can take it.
        :meth:`_accept` and, for an encoded reply with nothing queued,
        :meth:`_send_data_sync`, inline (this runs once per request)."""
        counters = self.counters
        counters["received"] += 1
        if self.duplicates.seen(route, req.id):
            counters["duplicates"] += 1
            return 0
        now = self.client_last_seen = self.clock()
        out = self._run_fast(req, route, now)
        if out is None:
            return self._handle_admitted_sync(_Inbound(req, route, now))
        if type(out) is bytes:
            if self._outbox:
                self._send_data_sync(route, out)
                return 1
            try:
                self._send_encoded(route, out)
            except WouldBlock:
                self._enqueue_data(route, out)
            except (Unroutable, TransportError) as exc:
                counters["reply_send_failures"] += 1
                self._log_unsent(exc)
            else:
                counters["replied"] += 1
        else:
            assert isinstance(out, Reply)
            self._send_sync(route, out)
        return 1

    def _handle_sync(self, event: Any) -> int:
        work = self._classify(event)
        if work is None:
            return 0
        if isinstance(work, _BadFrameReply):
            self._send_sync(work.route, work.reply)
            return 0
        assert isinstance(work, _Inbound)
        fast = self._run_fast(work.request, work.route, work.received)
        if fast is not None:
            if type(fast) is bytes:
                self._send_data_sync(work.route, fast)
            else:
                assert isinstance(fast, Reply)
                self._send_sync(work.route, fast)
            return 1
        return self._handle_admitted_sync(work)

    def _handle_admitted_sync(self, work: _Inbound) -> int:
        """Poll mode, the general path: admission, then the handler."""
        admitted = self._admit(work)
        if isinstance(admitted, Reply):
            self._send_sync(work.route, admitted)
            return 1
        spec, payload = admitted
        if spec.is_async:
            if work.request.key:  # it never ran: a retry under serve() may run it
                self.results.abandon(self._key_scope(work.route, work.request), spec.name,
                                     work.request.key)
            reply = self._exception_reply(work, _AsyncHandlerInPoll(
                f"{spec.name!r} is async; serve it with EngineEndpoint.serve()"))
        else:
            token = current_trace.set(work.request.trace)
            running = self._begin(work.request, work.route)
            done: Reply | None = None
            try:
                result = (spec.handler(payload) if payload is not _NONE and spec.takes_payload
                          else spec.handler())
            except Exception as exc:
                reply = done = self._exception_reply(work, exc)
            else:
                reply = done = self._result_reply(work, result)
            finally:
                self._end(work.request, work.route, done, running)
                current_trace.reset(token)
        self._send_sync(work.route, reply)
        return 1

    def metrics(self) -> dict[str, Any]:
        """This engine's metrics: the engine side of the one metrics shape (the
        README's metrics table; :func:`ctlwire.kernel.metrics.engine_metrics` returns
        the same); also served to clients as the built-in ``ctlwire.metrics``
        method (``await client.engine_metrics(rank)``)."""
        counters = dict(self.counters)
        running = list(self.running.items())
        cache = self.results
        transport = self.transport
        return {
            "role": "engine",
            "rank": self.rank,
            "incarnation": self.incarnation,
            "live_requests": len(running),
            "outcomes": {s.name: n for s, n in self.states.items() if n},
            "frames_dropped": {k.removeprefix("dropped_"): counters.get(k, 0)
                               for k in _ENGINE_DROPS},
            "methods": self.methods,
            "running": {rid: m for rid, (m, _) in running},
            "beacon": self.beacon_active,
            "loops": self.loops,
            "fence_high": self.fence_high,
            "fence_window": self.fences.window,
            # request ids remembered per route to drop duplicates, bounded
            "duplicate_filter": {"ids": len(self.duplicates),
                                 "peers_evicted": self.duplicates.peers_evicted},
            "idempotency_cache": {"entries": len(cache), "bytes": cache.bytes,
                                  "max_bytes": cache.max_bytes, "hits": cache.hits,
                                  "evicted": cache.evicted, "refused_full": cache.refused_full,
                                  "results_not_kept": cache.results_not_kept},
            # serve mode: requests taken and not started, in bytes, against their budget
            "queued_requests": {"bytes": self.queued_requests.held,
                                "peak_bytes": self.queued_requests.peak,
                                "limit_bytes": self.queued_requests.limit},
            # replies waiting for clients that do not read, bounded per route and in total
            "outbox": {"replies": self.outbox_replies, "bytes": self._outbox_bytes,
                       "peak_bytes": self.outbox_peak_bytes, "routes": len(self._outbox),
                       "stalled_routes": len(self._stalled),
                       # what libzmq itself may hold per connection (both directions)
                       "transport_bound_bytes_per_connection": int(
                           bound() if (bound := getattr(transport, "queued_bytes_bound",
                                                        None)) is not None else 0)},
            # connections open on the transport's listening sockets, and those refused
            # because max_connections were open (engines that bind)
            "connections": {"open": int(getattr(transport, "open_connections", 0)),
                            "refused": int(getattr(transport, "connections_refused", 0))},
            # client routes refused because the route table was full of live ones
            "routes_refused": int(getattr(self.transport, "routes_refused", 0)),
            "counters": counters,
            # client keys this engine's CURVE authenticator refused (engines that bind)
            "auth_rejections": int(getattr(self.transport, "auth_rejections", 0)),
            # deprecated aliases of the shape before 0.2: top-level counters, states
            "states": {s.name: n for s, n in self.states.items()},
            **counters,
        }


def _no_encoded_send(route: Route, data: bytes) -> None:  # pragma: no cover - never called
    raise AssertionError("no encoded send without an envelope encoder")


class _AsyncHandlerInPoll(Exception):
    code = ErrorCode.ASYNC_HANDLER_IN_POLL
