"""The engine's inbound core: every decision about a received request, and every
``InboundRequest`` transition, in one place (sans-IO; time passed in as a clock).

::

    item = core.accept(request, route)      # None: a duplicate (dropped, counted)
    refused = core.admit(item)              # a Reply: Rejected / Expired / a replay
    work = core.arrive(request, route)      # both at once: Running, a Reply, or None
    reply = core.result(item, value)        # Running -> Replied (or core.error(item, exc))

Guarantees:

* **One table.** A request's state moves only through
  :data:`~ctlwire.states.INBOUND_REQUEST_TABLE` (:meth:`InboundRequest.go`):
  Received → Running → Replied, or Received → Rejected / Expired. An illegal
  move raises :class:`~ctlwire.states.IllegalTransition`.
* **Duplicates** of an id the same route sent are dropped and counted
  (:class:`~ctlwire.kernel.core.duplicate_filter.DuplicateFilter`).
* **Admission**, in this order: protocol major, rank, method (allow-list),
  deadline, fence, idempotency key, payload type. A request moves the fence and
  records its key only once fully validated, and only for a state-changing
  method (read-only ones ignore fences and keys). :meth:`InboundCore.admit`
  does it all at once; a request that waits before it starts is validated,
  and its key recorded as running, as it arrives (:meth:`InboundCore.check`),
  and checked again as it starts (:meth:`InboundCore.start`: deadline, fence),
  so nothing it was refused for waits in a queue, a repeat of its key is
  answered ``InProgress`` at once, and nothing that changed while it waited is
  missed; refused after it arrived, it forgets its key.
* **Idempotency keys** are scoped by the connection a request came on:
  ``(route, method, key)``, never the ``client`` field a request carries; where
  there is no route (a DEALER, PULL or PAIR engine: one client connection) the
  request's ``client`` field stands for that connection. A repeat gets the first run's outcome,
  result or error; a run that ends with no outcome (:meth:`InboundCore.cancelled`),
  or that its handler refused (:class:`Refused`), forgets its key, so a retry
  is judged again. A new key is charged to its sender (:meth:`InboundCore.peer`:
  its connection, or the key its transport names for it), whose share of the cache is bounded
  (:class:`~ctlwire.kernel.core.result_cache.ResultCache`).
* **Busy** (:meth:`InboundCore.busy`): a request its engine has no room to
  queue is refused ``Busy`` (429) and counted; it did not run.
* **Bad frames** whose id can be read get a typed error reply; others are counted.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

import msgspec

from ctlwire.kernel.core.duplicate_filter import DuplicateFilter
from ctlwire.kernel.core.fencing import FenceGuard, FenceVerdict
from ctlwire.kernel.core.inbound_request import BadFrame, InboundRequest, MethodSpec
from ctlwire.kernel.core.result_cache import RUNNING, RecordedOutcome, ResultCache
from ctlwire.kernel.errors import CtlwireError, error_info
from ctlwire.states import InboundEvent, InboundState
from ctlwire.transports.codec import Codec, PayloadTypeError
from ctlwire.transports.envelope import ErrorInfo, Heartbeat, Reply, Request
from ctlwire.transports.error_codes import ErrorCode
from ctlwire.transports.protocol_version import (
    PROTOCOL_MAJOR,
    PROTOCOL_VERSION,
    version_text,
)
from ctlwire.transports.transport import Dropped, Received, Route

__all__ = ["BadFrame", "InboundCore", "InboundRequest", "MethodSpec", "Refused"]


class Refused(CtlwireError):
    """Raised by a handler to refuse its request before changing anything (an
    operation step out of order, say): the reply is this error, like any
    handler's, but it is not recorded under the request's idempotency key, so
    a retry is judged again and a refused request never holds a key."""


# the events as module constants: an enum class's attribute costs a lookup per read
_START, _REPLY, _REJECT, _EXPIRE = (InboundEvent.START, InboundEvent.REPLY, InboundEvent.REJECT,
                                    InboundEvent.EXPIRE)
_REQUEST_COUNTERS = ("received", "rejected", "expired", "handler_errors", "duplicates",
                     "dropped_malformed", "dropped_oversized", "dropped_framing",
                     "dropped_wrong_type", "error_replies_for_bad_frames", "heartbeats_received",
                     "fenced", "fence_out_of_range", "idempotent_replays",
                     "idempotent_in_progress", "idempotency_key_too_long",
                     "idempotency_cache_full", "busy", "internal_errors")

MAX_LISTED = 256
"""At most this many method names (sorted) in an ``UnknownMethod`` reply's result."""


class InboundCore:
    """Admission and completion of received requests; see the module docstring."""

    def __init__(self, methods: Mapping[str, MethodSpec], codec: Codec, *, rank: int,
                 incarnation: int, clock: Callable[[], float],
                 duplicates: DuplicateFilter | None = None, fences: FenceGuard | None = None,
                 results: ResultCache | None = None,
                 key_of: Callable[[Route], str | None] | None = None) -> None:
        self.methods = methods
        self.codec = codec
        self.rank = rank
        self.incarnation = incarnation
        self.clock = clock
        self.duplicates = duplicates if duplicates is not None else DuplicateFilter()
        self.fences = fences if fences is not None else FenceGuard()
        self.results = results if results is not None else ResultCache()
        #: the authenticated key of a route's connection (a CURVE engine that binds), if any
        self.key_of = key_of
        self.client_last_seen: float | None = None
        self.counters: dict[str, int] = dict.fromkeys(_REQUEST_COUNTERS, 0)
        self.states: dict[InboundState, int] = dict.fromkeys(InboundState, 0)
        self._nil = codec.encode_value(None)

    # -- from the transport ------------------------------------------------------
    def accept(self, req: Request, route: Route, size: int = 0) -> InboundRequest | None:
        """A received request (Received), or None for a duplicate of an id the
        same route sent (dropped, counted). ``size``: the bytes of its frame."""
        counters = self.counters
        counters["received"] += 1
        if self.duplicates.seen(route, req.id):
            counters["duplicates"] += 1
            return None
        now = self.client_last_seen = self.clock()
        return InboundRequest(req, route, now, size=size)

    def arrive(self, req: Request, route: Route, size: int = 0) -> InboundRequest | Reply | None:
        """:meth:`accept` then :meth:`admit`, for a request that starts as it
        arrives (a poll loop's): the request Running (run its handler), the reply
        that ends it here, or None for a duplicate (dropped, counted)."""
        item = self.accept(req, route, size)
        if item is None:
            return None
        refused = self.admit(item, item.received)
        return item if refused is None else refused

    def receive(self, event: Any) -> InboundRequest | BadFrame | None:
        """Any transport event: a request (:meth:`accept`), the error reply of a
        bad frame whose id was read, or None (a heartbeat, a drop, counted)."""
        counters = self.counters
        if type(event) is Received:
            env = event.envelope
            if type(env) is Request:
                return self.accept(env, event.route, event.size)
            counters["received"] += 1
            if type(env) is not Heartbeat:
                counters["dropped_wrong_type"] += 1
            elif env.version >> 8 != PROTOCOL_MAJOR:  # a client this engine cannot serve
                self._count("protocol_version_refused")
                self._count("dropped_protocol_version")
            else:
                counters["heartbeats_received"] += 1
                self.client_last_seen = self.clock()
            return None
        counters["received"] += 1
        if type(event) is Dropped:
            self._count(f"dropped_{event.reason}")
            if event.request_id:
                counters["error_replies_for_bad_frames"] += 1
                name, code = (("OversizedFrame", ErrorCode.OVERSIZED_FRAME)
                              if event.reason == "oversized"
                              else ("MalformedFrame", ErrorCode.MALFORMED_FRAME))
                return BadFrame(event.route, self.error_reply(
                    event.request_id, name, event.detail, code))
        return None  # PeerDisconnected: nothing to do engine-side

    # -- admission ---------------------------------------------------------------
    def admit(self, item: InboundRequest, now: float | None = None) -> Reply | None:
        """Received → Running (None: run ``item.spec.handler(*item.args)``), or the
        reply that ends it here: Rejected, Expired, or Replied with a recorded
        outcome (a repeated idempotency key). ``now``: the clock, when the caller
        has just read it (the deadline is checked against the time it starts).
        :meth:`check` then :meth:`start`, for a request that starts as it arrives."""
        if now is None:
            now = self.clock()
        refused = self._check(item, now)
        return self._begin(item, now) if refused is None else refused

    def check(self, item: InboundRequest, now: float | None = None) -> Reply | None:
        """Validate ``item`` as it arrives, for a request that waits before it
        starts: None when it may run (``item.spec`` and ``item.args`` set, still
        Received; :meth:`start` it), else the reply that ends it here, as
        :meth:`admit` -- ``InProgress`` at once for a key whose first request runs
        or waits to start. Its key is recorded as running now, so a repeat that
        arrives while it waits is refused at once too; the fence is not moved.
        A request checked and then refused (:meth:`busy`, or by :meth:`start`)
        forgets its key."""
        if now is None:
            now = self.clock()
        refused = self._check(item, now)
        if refused is None:
            refused = self._take_key(item, now)
        return refused

    def _check(self, item: InboundRequest, now: float) -> Reply | None:
        req = item.request
        spec = self.methods.get(req.method)
        if req.version >> 8 != PROTOCOL_MAJOR:
            self._count("protocol_version_refused")
            return self._reject(item, "UnsupportedProtocolVersion",
                                f"this engine speaks protocol {version_text(PROTOCOL_VERSION)}, "
                                f"the request {version_text(req.version)}",
                                ErrorCode.UNSUPPORTED_PROTOCOL_VERSION)
        if req.rank != self.rank:
            return self._reject(item, "WrongRank", f"this is rank {self.rank}, not {req.rank}",
                                ErrorCode.WRONG_RANK)
        if spec is None:  # the reply's result lists the methods this engine serves
            return self._reject(item, "UnknownMethod",
                                f"no control method {req.method!r} on this engine",
                                ErrorCode.UNKNOWN_METHOD,
                                self.codec.encode_value(sorted(self.methods)[:MAX_LISTED]))
        if req.deadline and now > req.deadline:
            return self._expire(item, now)
        read_only = spec.read_only
        fence = 0 if read_only else req.fence
        if fence:
            refused = self._fence_refusal(item, fence)
            if refused is not None:
                return refused
        key = "" if read_only else req.key
        if key:
            replayed = self._replay(item, key)
            if replayed is not None:
                return replayed
        raw = req.payload
        if spec.payload_optional and raw == self._nil:
            args: tuple[Any, ...] = ()  # no payload sent: the handler's default applies
        else:
            try:
                payload = spec.decode(raw) if spec.decode is not None else _UNDECODED
            except Exception:
                payload = _UNDECODED
            if payload is _UNDECODED:
                try:
                    payload = self.codec.decode_value(raw, spec.payload_type)
                except PayloadTypeError as exc:
                    return self._reject(item, "InvalidPayload", f"{req.method!r}: {exc}",
                                        ErrorCode.INVALID_PAYLOAD)
            if spec.takes_payload:
                args = (payload,)
            elif payload is not None:
                return self._reject(item, "InvalidPayload", f"{req.method!r} takes no payload",
                                    ErrorCode.INVALID_PAYLOAD)
            else:
                args = ()
        item.spec, item.args = spec, args
        return None

    def start(self, item: InboundRequest, now: float | None = None) -> Reply | None:
        """A request :meth:`check` passed starts: Running (None), or the reply that
        ends it now -- Expired (its deadline passed while it waited), Fenced (a newer
        token was accepted meanwhile); refused, it forgets its key."""
        req, spec = item.request, item.spec
        assert spec is not None, "start() a request check() passed"
        if now is None:
            now = self.clock()
        if req.deadline and now > req.deadline:
            self._drop_key(item)
            return self._expire(item, now)
        if not spec.read_only and req.fence:
            refused = self._fence_refusal(item, req.fence)
            if refused is not None:
                self._drop_key(item)
                return refused
        return self._begin(item, now)

    def _begin(self, item: InboundRequest, now: float) -> Reply | None:
        """Received → Running, once validated: the key recorded (``CacheFull`` when
        its sender's share, or the cache, has no room), the fence moved."""
        req, spec = item.request, item.spec
        assert spec is not None
        if not spec.read_only:
            if req.key and not item.key_held:
                refused = self._take_key(item, now)
                if refused is not None:
                    return refused
            if req.fence:
                self.fences.accept(req.fence)
        item.go(_START)
        return None

    def _take_key(self, item: InboundRequest, now: float) -> Reply | None:
        """Record a validated request's key as running: None, or ``CacheFull`` when
        its sender's share, or the cache, has no room (nothing recorded)."""
        req, spec = item.request, item.spec
        assert spec is not None
        if not req.key or spec.read_only:
            return None
        if not self.results.start(self._scope(item), req.method, req.key, now,
                                  owner=self.peer(item.route, req.client)):
            self.counters["idempotency_cache_full"] += 1
            return self._reject(item, "CacheFull", f"{req.method!r}: no room for a new "
                                "idempotency key (this connection's share of the cache, or "
                                "the cache, holds only entries within their retry window); "
                                "not run, retry later", ErrorCode.CACHE_FULL)
        item.key_held = True
        return None

    def _drop_key(self, item: InboundRequest) -> None:
        """A request that held its key ends without running: the key is forgotten."""
        if item.key_held:
            item.key_held = False
            self.cancelled(item)

    def busy(self, item: InboundRequest, why: str) -> Reply:
        """Received → Rejected with ``Busy`` (429, counted): no room to queue
        ``item`` (``why``); it did not run, a retry later is safe."""
        self.counters["busy"] += 1
        self._drop_key(item)
        return self._reject(item, "Busy", f"{item.request.method!r}: {why}; not run, retry "
                            "later", ErrorCode.BUSY)

    def peer(self, route: Route, client: int) -> Hashable:
        """Who sent a request, as far as this engine can tell and no other peer can
        claim: the authenticated key its transport names for the connection
        (``transport.peer_key(route)``, where it has one), else its connection
        (``route``) -- never the ``client`` field, which any request may carry. A
        transport without routes has one connection, the client it dialed: the
        request's ``client`` field (the client's incarnation) names it."""
        if route is None:
            return ("client", client)
        key_of = self.key_of
        if key_of is not None:
            key = key_of(route)
            if key:
                return ("key", key)
        return route

    def _expire(self, item: InboundRequest, now: float) -> Reply:
        req = item.request
        self.counters["expired"] += 1
        return self._end(item, _EXPIRE, self.error_reply(
            req.id, "DeadlineExpired",
            f"{req.method!r} arrived {now - req.deadline:.3f} s after its deadline",
            ErrorCode.DEADLINE_EXPIRED))

    def _fence_refusal(self, item: InboundRequest, fence: int) -> Reply | None:
        req = item.request
        verdict = self.fences.verdict(fence, item.received)
        if verdict is FenceVerdict.ADMIT:
            return None
        if verdict is FenceVerdict.STALE:
            self.counters["fenced"] += 1
            return self._reject(item, "Fenced", f"{req.method!r}: fencing token {fence} is "
                                f"older than {self.fences.high}, already accepted",
                                ErrorCode.FENCED)
        self.counters["fence_out_of_range"] += 1
        return self._reject(item, "FenceOutOfRange", f"{req.method!r}: fencing token {fence} "
                            f"is outside 1..{self.fences.limit(item.received)} (microseconds "
                            f"since the epoch, at most {self.fences.window:g} s ahead of this "
                            "engine's clock)", ErrorCode.FENCE_OUT_OF_RANGE)

    def _replay(self, item: InboundRequest, key: str) -> Reply | None:
        """The reply to a key already recorded (or refused), else None: run it. A
        key whose first request still runs (or waits to start) is refused
        ``InProgress``."""
        req = item.request
        results = self.results
        if not results.key_fits(key):
            self.counters["idempotency_key_too_long"] += 1
            return self._reject(item, "KeyTooLong", f"{req.method!r}: an idempotency key is at "
                                f"most {results.max_key_bytes} bytes", ErrorCode.KEY_TOO_LONG)
        recorded = results.lookup(self._scope(item), req.method, key)
        if recorded is None:
            return None
        if recorded is RUNNING:
            self.counters["idempotent_in_progress"] += 1
            return self._reject(item, "InProgress", f"{req.method!r} with idempotency key "
                                f"{key[:64]!r} is still running", ErrorCode.IN_PROGRESS)
        self.counters["idempotent_replays"] += 1
        item.go(_START)
        return self._end(item, _REPLY, Reply(
            req.id, self.rank, self.incarnation, recorded.ok,
            msgspec.Raw(recorded.result) if recorded.ok else self._nil, recorded.error))

    def _scope(self, item: InboundRequest) -> Hashable:
        """Whose keys ``item``'s key is among: its connection's (its route), never
        the ``client`` field it carries; without a route (a DEALER, PULL or PAIR
        engine's one client connection) the ``client`` field names the connection."""
        route = item.route
        return ("client", item.request.client) if route is None else route

    # -- completion ----------------------------------------------------------------
    def result(self, item: InboundRequest, value: Any) -> Reply:
        """Running → Replied with the handler's ``value`` (``ResultNotEncodable``
        when the codec refuses it); recorded under the request's key."""
        req = item.request
        encode = item.spec.encode if item.spec is not None else None
        try:
            raw = msgspec.Raw(encode(value)) if encode is not None else None
        except Exception:
            raw = None  # the codec's encode_value says why
        if raw is None:
            try:
                raw = self.codec.encode_value(value)
            except PayloadTypeError as exc:
                self.counters["handler_errors"] += 1
                return self._done(item, self.error_reply(
                    req.id, "ResultNotEncodable", f"{req.method!r}: {exc}",
                    ErrorCode.RESULT_NOT_ENCODABLE))
        return self._done(item, Reply(req.id, self.rank, self.incarnation, True, raw))

    def error(self, item: InboundRequest, exc: BaseException, *, record: bool = True) -> Reply:
        """Running → Replied with the error ``exc`` raised; recorded under the
        request's key unless ``record`` is False (the handler never ran)."""
        self.counters["handler_errors"] += 1
        reply = Reply(item.request.id, self.rank, self.incarnation, False, self._nil,
                      error_info(exc))
        if not record:
            self.cancelled(item)
            return self._end(item, _REPLY, reply)
        return self._done(item, reply)

    def cancelled(self, item: InboundRequest) -> None:
        """The run ended with no outcome: its key is forgotten, so a retry runs."""
        req = item.request
        if req.key and item.spec is not None and not item.spec.read_only:
            self.results.abandon(self._scope(item), req.method, req.key)

    def _done(self, item: InboundRequest, reply: Reply) -> Reply:
        req = item.request
        if req.key and item.spec is not None and not item.spec.read_only:
            self.results.finish(self._scope(item), req.method, req.key,
                                RecordedOutcome(reply.ok, bytes(reply.result), reply.error),
                                self.clock())
        return self._end(item, _REPLY, reply)

    # -- replies -------------------------------------------------------------------
    def error_reply(self, request_id: int, type_name: str, message: str, code: int,
                    result: msgspec.Raw | None = None) -> Reply:
        return Reply(request_id, self.rank, self.incarnation, False,
                     self._nil if result is None else result, ErrorInfo(type_name, message, code))

    def _reject(self, item: InboundRequest, type_name: str, message: str, code: int,
                result: msgspec.Raw | None = None) -> Reply:
        self.counters["rejected"] += 1
        return self._end(item, _REJECT,
                         self.error_reply(item.request.id, type_name, message, code, result))

    def _end(self, item: InboundRequest, event: InboundEvent, reply: Reply) -> Reply:
        self.states[item.go(event)] += 1
        return reply

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1


_UNDECODED: Any = object()
