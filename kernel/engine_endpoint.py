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
* **At most once.** A request id already seen from the same client (a
  duplicated frame) is dropped and counted, never run twice.
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
  ``(method, key)`` already ran is answered with the first run's outcome
  (:class:`~ctlwire.kernel.result_cache.ResultCache`); the handler runs once.
* **Fencing.** A request whose fencing token is lower than the highest token
  this engine has accepted is refused with ``Fenced`` (code 409) and not run.
* **A client that does not read cannot stall the others.** Replies that find
  their client's pipe full wait in a queue of that client's route only,
  bounded per route (``max_unread_replies``, ``max_unread_bytes``) and in
  total (``max_outbox_bytes``); beyond, a reply is dropped and counted
  (``replies_dropped_unread``). :meth:`poll` flushes every route's queue
  without letting a full one hold up the rest. Under :meth:`serve` a reply
  waits at most ``reply_send_timeout`` for room; a route that timed out is
  marked stalled and further replies to it are dropped at once (counted)
  until it takes one again, so the dispatcher keeps serving other clients.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import secrets
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_type_hints

import anyio
import anyio.abc
import msgspec
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ctlwire.kernel.actor import Actor
from ctlwire.kernel.builtin_methods import ENGINE_METRICS_METHOD
from ctlwire.kernel.errors import FENCED_CODE, error_info
from ctlwire.kernel.result_cache import RUNNING, RecordedOutcome, ResultCache
from ctlwire.kernel.tracing import current_trace
from ctlwire.states import INBOUND_REQUEST_TABLE, InboundEvent, InboundState
from ctlwire.transports.codec import PayloadTypeError
from ctlwire.transports.envelope import ErrorInfo, Heartbeat, Reply, Request
from ctlwire.transports.errors import (
    OversizedFrame,
    TransportClosed,
    TransportError,
    Unroutable,
    WouldBlock,
)
from ctlwire.transports.transport import Dropped, EngineTransport, Received, Route

__all__ = ["EngineEndpoint", "ErrorCode", "MethodSpec", "report_progress"]

log = logging.getLogger("ctlwire.engine")
_NONE = object()
_ENGINE_DROPS = ("duplicates", "dropped_malformed", "dropped_oversized", "dropped_framing",
                 "dropped_wrong_type", "reply_send_failures", "replies_too_large")
STEP_METHOD = "(step)"
"""The method a heartbeat names while the engine's own step keeps it from polling."""

_current_request: contextvars.ContextVar[tuple[EngineEndpoint, int] | None] = (
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


def new_incarnation() -> int:
    """An engine incarnation: milliseconds since the epoch, then 12 random bits.

    Later processes get larger numbers (clocks permitting), so a client can tell
    a heartbeat of an older, replaced process from one of a newer process.
    """
    return (time.time_ns() // 1_000_000) << 12 | secrets.randbits(12)


class ErrorCode:
    """``code`` values of the errors the endpoint itself produces."""

    UNKNOWN_METHOD = 404
    INVALID_PAYLOAD = 422
    DEADLINE_EXPIRED = 408
    MALFORMED_FRAME = 400
    OVERSIZED_FRAME = 413
    WRONG_RANK = 421
    RESULT_NOT_ENCODABLE = 500
    ASYNC_HANDLER_IN_POLL = 501
    FENCED = FENCED_CODE
    IN_PROGRESS = 425


@dataclass(frozen=True)
class MethodSpec:
    """A registered control method."""

    name: str
    handler: Callable[..., Any]
    payload_type: Any
    takes_payload: bool
    is_async: bool
    threaded: bool
    payload_optional: bool = False
    concurrency: int = 1


# INBOUND_REQUEST_TABLE's (state, event) -> state as nested dicts, read directly on the
# per-request hot path (apply() is the same lookup behind a method call)
_INBOUND_NEXT: dict[InboundState, dict[InboundEvent, InboundState]] = {}
for (_state, _event), _next in INBOUND_REQUEST_TABLE:
    _INBOUND_NEXT.setdefault(_state, {})[_event] = _next


# the common case's path through the table, read once: Received -start-> Running
# -reply-> Replied (the fast path below sets these states directly)
_RUNNING = _INBOUND_NEXT[InboundState.RECEIVED][InboundEvent.START]
_REPLIED = _INBOUND_NEXT[_RUNNING][InboundEvent.REPLY]
assert (_RUNNING, _REPLIED) == (InboundState.RUNNING, InboundState.REPLIED)


class _Inbound:
    """One received request moving through the InboundRequest table."""

    __slots__ = ("request", "route", "state")

    def __init__(self, request: Request, route: Route) -> None:
        self.request = request
        self.route = route
        self.state = InboundState.RECEIVED

    def go(self, event: InboundEvent) -> None:
        try:
            self.state = _INBOUND_NEXT[self.state][event]
        except KeyError:
            INBOUND_REQUEST_TABLE.apply(self.state, event, self.request.id)  # IllegalTransition
            raise


class _Dispatcher(Actor["_Inbound | _BadFrameReply", None]):
    """The actor that takes requests in arrival order for :meth:`EngineEndpoint.serve`:
    sync inline handlers run here, one at a time; async and threaded ones are
    passed to their method's lane. A reply handed over as such (a bad frame's, or
    one whose client's pipe was full) is sent from here, in turn.

    :attr:`inflight` counts messages told and not yet handled: while it is 0,
    :meth:`EngineEndpoint.serve` may do a request's dispatching itself (run a
    sync handler, pass to a lane) without overtaking anything."""

    def __init__(self, endpoint: EngineEndpoint, mailbox_size: int,
                 lanes: anyio.abc.TaskGroup) -> None:
        super().__init__(mailbox_size=mailbox_size, name=f"engine-{endpoint.rank}")
        self.endpoint = endpoint
        self.lanes_tg = lanes
        self.lanes: dict[str, MemoryObjectSendStream[_Inbound]] = {}
        self.inflight = 0

    async def told(self, message: _Inbound | _BadFrameReply) -> None:
        self.inflight += 1
        try:
            await self.tell(message)
        except BaseException:
            self.inflight -= 1
            raise

    async def handle(self, message: _Inbound | _BadFrameReply) -> None:
        try:
            endpoint = self.endpoint
            if type(message) is _BadFrameReply:
                await endpoint._send_async(message.route, message.reply)
                return
            assert isinstance(message, _Inbound)
            spec = endpoint._methods.get(message.request.method)
            if spec is None or not (spec.is_async or spec.threaded):
                await endpoint._run_async(message)
                return
            lane = self.lanes.get(spec.name)
            if lane is None:
                lane = self.lanes[spec.name] = self._open_lane(spec)
            await lane.send(message)  # waits while the lane is full (backpressure)
        finally:
            self.inflight -= 1

    def _open_lane(self, spec: MethodSpec) -> MemoryObjectSendStream[_Inbound]:
        send, recv = anyio.create_memory_object_stream[_Inbound](self.endpoint.mailbox_size)
        with recv:
            for i in range(spec.concurrency):
                self.lanes_tg.start_soon(self._lane_worker, recv.clone(),
                                         name=f"engine-{self.endpoint.rank}.{spec.name}.{i}")
        return send

    def close_lanes(self) -> None:
        for send in self.lanes.values():
            send.close()

    async def _lane_worker(self, recv: MemoryObjectReceiveStream[_Inbound]) -> None:
        endpoint = self.endpoint
        with recv:
            async for item in recv:  # workers take items in arrival order
                try:
                    await endpoint._run_async(item)
                except Exception:  # pragma: no cover - never let one request end the lane
                    endpoint.counters["internal_errors"] += 1
                    log.exception("engine %d: internal error handling %r", endpoint.rank, item)


class EngineEndpoint:
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
        clock: Callable[[], float] = time.time,
        beacon: bool = True,
        result_cache: ResultCache | None = None,
        max_unread_replies: int = 1024,
        max_unread_bytes: int = 4 << 20,
        max_outbox_bytes: int = 32 << 20,
        reply_send_timeout: float = 1.0,
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
        self._seen: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._dedup_window = dedup_window
        self._hb_seq = 0
        self._next_heartbeat = 0.0
        # replies waiting for room, per route (poll mode): route -> queue of (reply, size)
        self._outbox: OrderedDict[Route, deque[tuple[Reply, int]]] = OrderedDict()
        self._outbox_route_bytes: dict[Route, int] = {}
        self._outbox_bytes = 0
        self.max_unread_replies = max_unread_replies
        self.max_unread_bytes = max_unread_bytes
        self.max_outbox_bytes = max_outbox_bytes
        self.reply_send_timeout = reply_send_timeout
        # serve mode: routes whose last reply timed out waiting for room
        self._stalled: OrderedDict[Route, None] = OrderedDict()
        self.outbox_peak_bytes = 0
        self.heartbeats_paused = False
        self.use_beacon = beacon
        self.beacon_active = False
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
        self.fence_high = 0
        self._polling = False
        self._nil = self.codec.encode_value(None)
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
            "idempotent_replays": 0,
            "idempotent_in_progress": 0,
        }
        self.states: dict[InboundState, int] = {s: 0 for s in InboundState}
        # built in, read-only, allow-listed like any method: what metrics() returns
        self.register(ENGINE_METRICS_METHOD, self.metrics, payload_type=None)
        self._builtin = frozenset(self._methods)

    # -- registration ----------------------------------------------------------
    def register(self, name: str, handler: Callable[..., Any], *, payload_type: Any = _NONE,
                 threaded: bool = False, concurrency: int = 1,
                 _caller_frame: int = 1) -> MethodSpec:
        """Allow ``name``, served by ``handler``.

        ``handler`` takes no argument or one (the payload, decoded as its
        annotation or ``payload_type``). Async handlers run in :meth:`serve`;
        sync ones run inline, or in a worker thread with ``threaded=True``.
        Under :meth:`serve`, async and threaded handlers of one method run at
        most ``concurrency`` at a time (default 1: serial, in arrival order),
        concurrently with other methods.

        The payload annotation is resolved here, string annotations
        (``from __future__ import annotations``) included, in the handler's
        module and then in the scope that registers it (a ``msgspec.Struct``
        defined in the same function works). An annotation that cannot be
        resolved raises TypeError now: validation is never silently turned off
        (pass ``payload_type=`` to say the type explicitly).
        """
        if not name or not isinstance(name, str):
            raise ValueError("method name must be a non-empty string")
        if name in self._methods:
            raise ValueError(f"method {name!r} is already registered")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency of {name!r} must be an int >= 1, not {concurrency!r}")
        params = [p for p in inspect.signature(handler).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = [p for p in params if p.default is p.empty]
        if len(required) > 1:
            raise TypeError(f"handler for {name!r} must take at most one argument (the payload)")
        takes_payload = bool(params)
        if payload_type is _NONE:
            payload_type = Any
            if takes_payload:
                payload_type = _payload_annotation(name, handler, params[0], _caller_frame)
        optional = bool(params) and params[0].default is not params[0].empty
        spec = MethodSpec(name, handler, payload_type, takes_payload,
                          inspect.iscoroutinefunction(handler), threaded, optional, concurrency)
        self._methods[name] = spec
        if not (spec.is_async or spec.threaded):
            codec = self.codec.fast_value_codec(payload_type)
            if codec is not None:
                self._fast[name] = (spec, codec[0], codec[1])
        return spec

    def method(self, name: str | None = None, *, payload_type: Any = _NONE,
               threaded: bool = False, concurrency: int = 1
               ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator form of :meth:`register` (name defaults to the function's)."""

        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.register(name or fn.__name__, fn, payload_type=payload_type, threaded=threaded,
                          concurrency=concurrency,
                          _caller_frame=2)  # the scope applying the decorator
            return fn

        return deco

    @property
    def methods(self) -> list[str]:
        """The methods registered on this endpoint (not the built-in ones)."""
        return sorted(m for m in self._methods if m not in self._builtin)

    @property
    def builtin_methods(self) -> list[str]:
        """Methods every endpoint serves: ``ctlwire.metrics`` (its :meth:`metrics`)."""
        return sorted(self._builtin)

    # -- the shared, synchronous part of handling ------------------------------
    def _error_reply(self, request_id: int, type_name: str, message: str, code: int) -> Reply:
        return Reply(request_id, self.rank, self.incarnation, False, self.codec.encode_value(None),
                     ErrorInfo(type_name, message, code))

    def _fit(self, reply: Reply) -> Reply:
        """A reply the codec would refuse as oversized (a huge result, or an error
        message quoting a huge method name) becomes a small ReplyTooLarge error:
        the caller gets an answer, not a timeout. Encodes only when a cheap size
        bound says the reply might not fit."""
        err = reply.error
        bound = (len(reply.result) + 256 + reply.id.bit_length() // 3
                 + (6 * (len(err.type) + len(err.message)) if err is not None else 0))
        if bound <= self.codec.max_message_size:
            return reply
        try:
            self.codec.encode(reply)
        except OversizedFrame as exc:
            self.counters["replies_too_large"] += 1
            return self._error_reply(reply.id, "ReplyTooLarge", str(exc),
                                     ErrorCode.OVERSIZED_FRAME)
        return reply

    def _finish(self, item: _Inbound, event: InboundEvent, reply: Reply) -> Reply:
        item.go(event)
        self.states[item.state] += 1
        return reply

    def _admit(self, item: _Inbound) -> tuple[MethodSpec, Any] | Reply:
        """Received → Running, or a Rejected/Expired reply."""
        req = item.request
        if req.rank != self.rank:
            self.counters["rejected"] += 1
            return self._finish(item, InboundEvent.REJECT, self._error_reply(
                req.id, "WrongRank", f"this is rank {self.rank}, not {req.rank}",
                ErrorCode.WRONG_RANK))
        spec = self._methods.get(req.method)
        if spec is None:
            self.counters["rejected"] += 1
            return self._finish(item, InboundEvent.REJECT, self._error_reply(
                req.id, "UnknownMethod", f"no control method {req.method!r} on this engine",
                ErrorCode.UNKNOWN_METHOD))
        if req.deadline and self.clock() > req.deadline:
            self.counters["expired"] += 1
            return self._finish(item, InboundEvent.EXPIRE, self._error_reply(
                req.id, "DeadlineExpired",
                f"{req.method!r} arrived {self.clock() - req.deadline:.3f} s after its deadline",
                ErrorCode.DEADLINE_EXPIRED))
        if req.fence > 0:  # 0 (or a nonsensical negative token): unfenced
            if req.fence < self.fence_high:
                self.counters["fenced"] += 1
                self.counters["rejected"] += 1
                return self._finish(item, InboundEvent.REJECT, self._error_reply(
                    req.id, "Fenced", f"{req.method!r}: fencing token {req.fence} is older than "
                    f"{self.fence_high}, already accepted", ErrorCode.FENCED))
            self.fence_high = req.fence
        if req.key:
            recorded = self.results.lookup(req.method, req.key)
            if recorded is RUNNING:
                self.counters["idempotent_in_progress"] += 1
                self.counters["rejected"] += 1
                return self._finish(item, InboundEvent.REJECT, self._error_reply(
                    req.id, "InProgress", f"{req.method!r} with idempotency key {req.key!r} "
                    "is still running", ErrorCode.IN_PROGRESS))
            if recorded is not None:
                self.counters["idempotent_replays"] += 1
                item.go(InboundEvent.START)
                return self._finish(item, InboundEvent.REPLY, Reply(
                    req.id, self.rank, self.incarnation, recorded.ok,
                    msgspec.Raw(recorded.result) if recorded.ok else self._nil, recorded.error))
        if spec.payload_optional and req.payload == self._nil:
            item.go(InboundEvent.START)
            return spec, _NONE  # no payload sent: the handler's default applies
        try:
            payload = self.codec.decode_value(req.payload, spec.payload_type)
        except PayloadTypeError as exc:
            self.counters["rejected"] += 1
            return self._finish(item, InboundEvent.REJECT, self._error_reply(
                req.id, "InvalidPayload", f"{req.method!r}: {exc}", ErrorCode.INVALID_PAYLOAD))
        if not spec.takes_payload and payload is not None:
            self.counters["rejected"] += 1
            return self._finish(item, InboundEvent.REJECT, self._error_reply(
                req.id, "InvalidPayload", f"{req.method!r} takes no payload",
                ErrorCode.INVALID_PAYLOAD))
        item.go(InboundEvent.START)
        return spec, payload

    def _run_fast(self, item: _Inbound) -> Reply | None:
        """The common case, start to reply, for a sync inline method: a request for
        this rank, fresh, unkeyed, not fenced out, whose payload decodes as the
        method's type. Exactly what :meth:`_admit` then running the handler does
        (same counters, same states, same reply), minus the per-request lookups.
        None, having changed nothing, for anything else: the general path takes it."""
        req = item.request
        fast = self._fast.get(req.method)
        if fast is None or req.rank != self.rank or req.key:
            return None
        spec, encode, decode = fast
        if req.deadline and self.clock() > req.deadline:
            return None
        fence = req.fence
        if 0 < fence < self.fence_high:
            return None
        raw = req.payload
        if spec.payload_optional and raw == self._nil:
            args: tuple[Any, ...] = ()
        else:
            try:
                payload = decode(raw)
            except Exception:
                return None  # the general path says why (InvalidPayload, or an empty Raw)
            if spec.takes_payload:
                args = (payload,)
            elif payload is not None:
                return None
            else:
                args = ()
        if fence > 0:
            self.fence_high = fence
        item.state = _RUNNING
        rid = req.id
        running = self.running
        running[rid] = (req.method, time.monotonic())
        trace_token = current_trace.set(req.trace)
        token = _current_request.set((self, rid))
        done: Reply | None = None
        try:
            result = spec.handler(*args)
        except Exception as exc:
            done = self._exception_reply(item, exc)
        else:
            try:
                data = encode(result)
            except Exception:
                done = self._result_reply(item, result)  # says ResultNotEncodable
            else:
                done = Reply(rid, self.rank, self.incarnation, True, msgspec.Raw(data))
                item.state = _REPLIED
                self.states[_REPLIED] += 1
        finally:
            _current_request.reset(token)
            current_trace.reset(trace_token)
            running.pop(rid, None)
            if self._progress:
                self._progress.pop(rid, None)
            self._last_loop = time.monotonic()
        return done

    def _result_reply(self, item: _Inbound, result: Any) -> Reply:
        req = item.request
        try:
            raw = self.codec.encode_value(result)
        except PayloadTypeError as exc:
            self.counters["handler_errors"] += 1
            return self._finish(item, InboundEvent.REPLY, self._error_reply(
                req.id, "ResultNotEncodable", f"{req.method!r}: {exc}",
                ErrorCode.RESULT_NOT_ENCODABLE))
        return self._finish(item, InboundEvent.REPLY,
                            Reply(req.id, self.rank, self.incarnation, True, raw))

    def _exception_reply(self, item: _Inbound, exc: BaseException) -> Reply:
        self.counters["handler_errors"] += 1
        info = error_info(exc)
        return self._finish(item, InboundEvent.REPLY, Reply(
            item.request.id, self.rank, self.incarnation, False, self.codec.encode_value(None),
            info))

    # -- what is running (read by the beacon's thread) ---------------------------
    def _begin(self, req: Request) -> contextvars.Token[tuple[EngineEndpoint, int] | None]:
        self.running[req.id] = (req.method, time.monotonic())
        if req.key:
            self.results.start(req.method, req.key)
        return _current_request.set((self, req.id))

    def _end(self, req: Request, reply: Reply | None,
             token: contextvars.Token[tuple[EngineEndpoint, int] | None]) -> None:
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

    def _classify(self, event: Any) -> _Inbound | _BadFrameReply | None:
        """Turn a transport event into work (an _Inbound), an immediate reply, or nothing."""
        self.counters["received"] += 1
        if type(event) is Received:
            env = event.envelope
            if type(env) is Request:
                key = (env.client, env.id)
                if key in self._seen:
                    self.counters["duplicates"] += 1
                    return None
                self._seen[key] = None
                if len(self._seen) > self._dedup_window:
                    self._seen.popitem(last=False)
                self.client_last_seen = self.clock()
                return _Inbound(env, event.route)
            if type(env) is Heartbeat:
                self.counters["heartbeats_received"] += 1
                self.client_last_seen = self.clock()
                return None
            self.counters["dropped_wrong_type"] += 1
            return None
        if type(event) is Dropped:
            counter = f"dropped_{event.reason}"
            self.counters[counter] = self.counters.get(counter, 0) + 1
            if event.request_id:
                self.counters["error_replies_for_bad_frames"] += 1
                code = (ErrorCode.OVERSIZED_FRAME if event.reason == "oversized"
                        else ErrorCode.MALFORMED_FRAME)
                reply = self._error_reply(event.request_id, "MalformedFrame", event.detail, code)
                return _BadFrameReply(event.route, reply)
            return None
        return None  # PeerDisconnected: nothing to do engine-side

    # -- synchronous embedding -------------------------------------------------
    def open(self) -> None:
        """Open the transport (sync engines), start the liveness beacon where the
        transport has one, and send the first heartbeat. Idempotent;
        :meth:`poll` calls it when it was not called."""
        self.transport.open()
        if not self._opened:
            self._opened = True
            self._polling = True
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
        self.loop_came_round()
        self._heartbeat_if_due()
        self._flush_outbox()
        handled = 0
        for _ in range(max_messages):
            try:
                event = self.transport.try_receive()
            except TransportClosed:
                break
            if event is None:
                break
            try:
                handled += self._handle_sync(event)
            except Exception:  # pragma: no cover - never let one frame end the loop
                self.counters["internal_errors"] += 1
                log.exception("engine %d: internal error handling %r", self.rank, event)
        return handled

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
                    self.transport.wait_readable(wait)
        finally:
            self.close()

    def _handle_sync(self, event: Any) -> int:
        work = self._classify(event)
        if work is None:
            return 0
        if isinstance(work, _BadFrameReply):
            self._send_sync(work.route, work.reply)
            return 0
        assert isinstance(work, _Inbound)
        fast = self._run_fast(work)
        if fast is not None:
            self._send_sync(work.route, fast)
            return 1
        admitted = self._admit(work)
        if isinstance(admitted, Reply):
            self._send_sync(work.route, admitted)
            return 1
        spec, payload = admitted
        if spec.is_async:
            reply = self._exception_reply(work, _AsyncHandlerInPoll(
                f"{spec.name!r} is async; serve it with EngineEndpoint.serve()"))
        else:
            token = current_trace.set(work.request.trace)
            running = self._begin(work.request)
            done: Reply | None = None
            try:
                result = (spec.handler(payload) if payload is not _NONE and spec.takes_payload
                          else spec.handler())
            except Exception as exc:
                reply = done = self._exception_reply(work, exc)
            else:
                reply = done = self._result_reply(work, result)
            finally:
                self._end(work.request, done, running)
                current_trace.reset(token)
        self._send_sync(work.route, reply)
        return 1

    def _send_sync(self, route: Route, reply: Reply) -> None:
        reply = self._fit(reply)
        if route in self._outbox:
            self._enqueue(route, reply)  # behind the replies already waiting for this route
            self._flush_route(route)
            return
        try:
            self.transport.send_nowait(route, reply)
            self.counters["replied"] += 1
        except WouldBlock:
            self._enqueue(route, reply)
        except (Unroutable, TransportError) as exc:
            self.counters["reply_send_failures"] += 1
            log.warning("engine %d: reply %d not sent: %r", self.rank, reply.id, exc)

    @staticmethod
    def _reply_size(reply: Reply) -> int:
        err = reply.error
        return 64 + len(reply.result) + (len(err.type) + len(err.message) if err else 0)

    def _enqueue(self, route: Route, reply: Reply) -> None:
        """Queue ``reply`` for ``route``, whose pipe is full; drop and count it
        when the route's queue or the whole outbox is at its bound."""
        size = self._reply_size(reply)
        queue = self._outbox.get(route)
        held = self._outbox_route_bytes.get(route, 0)
        if ((queue is not None and len(queue) >= self.max_unread_replies)
                or held + size > self.max_unread_bytes
                or self._outbox_bytes + size > self.max_outbox_bytes):
            self.counters["replies_dropped_unread"] += 1
            return
        if queue is None:
            queue = self._outbox[route] = deque()
        queue.append((reply, size))
        self._outbox_route_bytes[route] = held + size
        self._outbox_bytes += size
        self.outbox_peak_bytes = max(self.outbox_peak_bytes, self._outbox_bytes)

    def _flush_route(self, route: Route) -> None:
        """Send ``route``'s waiting replies until its pipe is full again."""
        queue = self._outbox.get(route)
        while queue:
            reply, size = queue[0]
            try:
                self.transport.send_nowait(route, reply)
                self.counters["replied"] += 1
            except WouldBlock:
                return
            except (Unroutable, TransportError) as exc:
                self.counters["reply_send_failures"] += 1
                log.warning("engine %d: reply %d not sent: %r", self.rank, reply.id, exc)
            queue.popleft()
            self._outbox_bytes -= size
            self._outbox_route_bytes[route] -= size
        self._outbox.pop(route, None)
        self._outbox_route_bytes.pop(route, None)

    def _flush_outbox(self) -> None:
        """Flush every route's queue; a full route does not hold up the others."""
        for route in list(self._outbox):
            self._flush_route(route)

    @property
    def outbox_bytes(self) -> int:
        """Bytes of replies waiting for room (poll mode)."""
        return self._outbox_bytes

    @property
    def outbox_replies(self) -> int:
        return sum(len(q) for q in self._outbox.values())

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

    # -- asynchronous embedding ------------------------------------------------
    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                    ) -> None:
        """Serve until cancelled or the transport closes. Opens and closes the
        transport; runs heartbeats in a task of its own, so a long async
        handler does not make the engine look dead. Async and threaded
        handlers run in one lane per method (see the module docstring's
        ordering guarantee), so a long or hung handler delays only requests
        of its own method."""
        async with self.transport, anyio.create_task_group() as lanes:
            dispatcher = _Dispatcher(self, self.mailbox_size, lanes)
            async with dispatcher:
                await self._serve_loop(dispatcher, lanes, task_status)

    async def _serve_loop(self, dispatcher: _Dispatcher, lanes: anyio.abc.TaskGroup,
                          task_status: anyio.abc.TaskStatus[None]) -> None:
        self._polling = False
        self._start_beacon()
        if not self.beacon_active:
            self.send_heartbeat()
        async with anyio.create_task_group() as tg:
            if self.heartbeat_interval:
                tg.start_soon(self._heartbeat_loop)
            task_status.started()
            try:
                while True:
                    try:
                        event = await self.transport.receive()
                    except TransportClosed:
                        break
                    try:
                        work = self._classify(event)
                    except Exception:  # pragma: no cover
                        self.counters["internal_errors"] += 1
                        log.exception("engine %d: cannot classify %r", self.rank, event)
                        continue
                    if work is None:
                        continue
                    if isinstance(work, _BadFrameReply):
                        await self._send_async(work.route, work.reply)
                        continue
                    if not dispatcher.inflight and self._dispatch_now(dispatcher, work):
                        continue
                    await dispatcher.told(work)
            finally:
                tg.cancel_scope.cancel()
                lanes.cancel_scope.cancel()
                dispatcher.close_lanes()

    def _dispatch_now(self, dispatcher: _Dispatcher, work: _Inbound) -> bool:
        """With nothing queued at the dispatcher, do its work for ``work`` here
        (the same order, without the hop through its mailbox): run a sync
        handler on the fast path and send the reply, or pass the request to its
        method's open lane when that has room. False when the dispatcher has to
        take it. A reply that finds the client's pipe full is handed to the
        dispatcher, which waits for room (bounded, see :meth:`_send_async`)."""
        reply = self._run_fast(work)
        if reply is not None:
            reply = self._fit(reply)
            if not self._send_now(work.route, reply):
                dispatcher.inflight += 1
                try:
                    dispatcher.tell_nowait(_BadFrameReply(work.route, reply))
                except BaseException:
                    dispatcher.inflight -= 1
                    raise
            return True
        spec = self._methods.get(work.request.method)
        if spec is None or not (spec.is_async or spec.threaded):
            return False
        lane = dispatcher.lanes.get(spec.name)
        if lane is None:
            return False
        try:
            lane.send_nowait(work)
        except anyio.WouldBlock:
            return False
        return True

    async def _heartbeat_loop(self) -> None:
        interval = self.heartbeat_interval
        assert interval
        while True:
            await anyio.sleep(interval)
            self.loop_came_round()
            if not self.beacon_active:
                self.send_heartbeat()

    async def _run_async(self, item: _Inbound) -> None:
        admitted = self._admit(item)
        if isinstance(admitted, Reply):
            await self._send_async(item.route, admitted)
            return
        spec, payload = admitted
        args = (payload,) if spec.takes_payload and payload is not _NONE else ()
        current_trace.set(item.request.trace)  # this task handles one request at a time
        running = self._begin(item.request)
        done: Reply | None = None
        try:
            try:
                if spec.is_async:
                    result = await spec.handler(*args)
                elif spec.threaded:
                    result = await anyio.to_thread.run_sync(spec.handler, *args)
                else:
                    result = spec.handler(*args)
            except Exception as exc:
                reply = done = self._exception_reply(item, exc)
            else:
                reply = done = self._result_reply(item, result)
        finally:
            self._end(item.request, done, running)
        await self._send_async(item.route, reply)

    def _send_now(self, route: Route, reply: Reply) -> bool:
        """Serve mode: send ``reply`` (already fitted) if the client's pipe has room,
        or drop it if that client is marked stalled, or count a failure. False
        when it has to wait for room."""
        try:
            self.transport.send_nowait(route, reply)
        except WouldBlock:
            if route in self._stalled:
                # this client stopped reading: do not make every request wait for it
                self.counters["replies_dropped_unread"] += 1
                return True
            return False
        except (Unroutable, TransportError) as exc:
            self.counters["reply_send_failures"] += 1
            log.warning("engine %d: reply %d not sent: %r", self.rank, reply.id, exc)
            return True
        if self._stalled:
            self._stalled.pop(route, None)
        self.counters["replied"] += 1
        return True

    async def _send_async(self, route: Route, reply: Reply) -> None:
        reply = self._fit(reply)
        if self._send_now(route, reply):
            return
        stalled = self._stalled
        try:
            with anyio.move_on_after(self.reply_send_timeout):
                await self.transport.send(route, reply)
                stalled.pop(route, None)
                self.counters["replied"] += 1
                return
            self.counters["replies_dropped_unread"] += 1
            stalled[route] = None
            while len(stalled) > 4096:
                stalled.popitem(last=False)
        except (Unroutable, TransportError) as exc:
            self.counters["reply_send_failures"] += 1
            log.warning("engine %d: reply %d not sent: %r", self.rank, reply.id, exc)

    def metrics(self) -> dict[str, Any]:
        """This engine's metrics: the engine side of the one metrics shape (the
        README's metrics table; :func:`ctlwire.kernel.metrics.engine_metrics` returns
        the same); also served to clients as the built-in ``ctlwire.metrics``
        method (``await client.engine_metrics(rank)``)."""
        counters = dict(self.counters)
        running = list(self.running.items())
        cache = self.results
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
            "idempotency_cache": {"entries": len(cache), "bytes": cache.bytes, "hits": cache.hits,
                                  "evicted": cache.evicted},
            # replies waiting for clients that do not read, bounded per route and in total
            "outbox": {"replies": self.outbox_replies, "bytes": self._outbox_bytes,
                       "peak_bytes": self.outbox_peak_bytes, "routes": len(self._outbox),
                       "stalled_routes": len(self._stalled)},
            # client routes refused because the route table was full of live ones
            "routes_refused": int(getattr(self.transport, "routes_refused", 0)),
            "counters": counters,
            # client keys this engine's CURVE authenticator refused (engines that bind)
            "auth_rejections": int(getattr(self.transport, "auth_rejections", 0)),
            # deprecated aliases of the shape before 0.2: top-level counters, states
            "states": {s.name: n for s, n in self.states.items()},
            **counters,
        }


def _payload_annotation(name: str, handler: Callable[..., Any], param: inspect.Parameter,
                        caller_frame: int) -> Any:
    """The resolved annotation of ``handler``'s payload parameter (Any if none).

    Tries ``get_type_hints`` (the handler's module), then the parameter's own
    string annotation evaluated with the registering scope's locals. Raises
    TypeError when neither resolves it."""
    annotation = param.annotation
    if annotation is inspect.Parameter.empty:
        return Any
    if not isinstance(annotation, str):
        return annotation
    try:
        return get_type_hints(handler).get(param.name, Any)
    except Exception:
        pass  # a local name: try the registering scope next
    frame = sys._getframe(caller_frame + 1)  # register's caller (or the decorator's)
    try:
        namespace = {**getattr(handler, "__globals__", {}), **frame.f_locals}
        return eval(annotation, namespace)  # an annotation the handler's author wrote
    except Exception as exc:
        raise TypeError(
            f"cannot resolve the payload annotation {annotation!r} of handler {name!r} "
            f"({exc}); define the type where the handler's module can see it, or pass "
            "payload_type=... explicitly") from None
    finally:
        del frame


class _AsyncHandlerInPoll(Exception):
    code = ErrorCode.ASYNC_HANDLER_IN_POLL


@dataclass(frozen=True)
class _BadFrameReply:
    route: Route
    reply: Reply
