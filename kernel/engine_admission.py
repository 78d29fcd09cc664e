"""A received request's way through the ``InboundRequest`` table: classifying a
transport event (duplicates, heartbeats, bad frames), admission (rank, method,
deadline, fencing, idempotency keys, payload validation), the fast path of a sync
inline method, and the replies for a result or an exception."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgspec

from ctlwire.kernel.core.duplicate_filter import DuplicateFilter
from ctlwire.kernel.core.fence_guard import FenceGuard, FenceVerdict
from ctlwire.kernel.core.result_cache import RUNNING
from ctlwire.kernel.engine_liveness import EngineLiveness, _current_request
from ctlwire.kernel.engine_registry import _NONE, ErrorCode, MethodSpec
from ctlwire.kernel.errors import error_info
from ctlwire.kernel.tracing import current_trace
from ctlwire.states import INBOUND_REQUEST_TABLE, InboundEvent, InboundState
from ctlwire.transports.codec import PayloadTypeError
from ctlwire.transports.envelope import Heartbeat, Reply, Request
from ctlwire.transports.protocol_version import (
    PROTOCOL_MAJOR,
    PROTOCOL_VERSION,
    version_text,
)
from ctlwire.transports.transport import Dropped, Received, Route

__all__ = ["EngineAdmission"]

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

    __slots__ = ("received", "request", "route", "state")

    def __init__(self, request: Request, route: Route, received: float) -> None:
        self.request = request
        self.route = route
        self.received = received  # the endpoint's clock() when it was classified
        self.state = InboundState.RECEIVED

    @classmethod
    def running(cls, request: Request, received: float) -> _Inbound:
        """One the fast path took (it sets the states without an _Inbound): Running."""
        item = cls(request, None, received)
        item.state = _RUNNING
        return item

    def go(self, event: InboundEvent) -> None:
        try:
            self.state = _INBOUND_NEXT[self.state][event]
        except KeyError:
            INBOUND_REQUEST_TABLE.apply(self.state, event, self.request.id)  # IllegalTransition
            raise


@dataclass(frozen=True)
class _BadFrameReply:
    route: Route
    reply: Reply


class EngineAdmission(EngineLiveness):
    """The admission part of an endpoint (see the module docstring)."""

    duplicates: DuplicateFilter
    fences: FenceGuard
    client_last_seen: float | None

    @property
    def fence_high(self) -> int:
        """The highest fencing token this engine has accepted (0: none)."""
        return self.fences.high

    def _finish(self, item: _Inbound, event: InboundEvent, reply: Reply) -> Reply:
        item.go(event)
        self.states[item.state] += 1
        return reply

    def _admit(self, item: _Inbound) -> tuple[MethodSpec, Any] | Reply:
        """Received → Running, or a Rejected/Expired reply. The one place that
        decides a request's fence and idempotency key: a request moves the
        fence, or records its key, only once it is fully validated (method,
        deadline, payload) and only for a state-changing method."""
        req = item.request
        if req.version >> 8 != PROTOCOL_MAJOR:
            self.counters["protocol_version_refused"] = (
                self.counters.get("protocol_version_refused", 0) + 1)
            self.counters["rejected"] += 1
            return self._finish(item, InboundEvent.REJECT, self._error_reply(
                req.id, "UnsupportedProtocolVersion",
                f"this engine speaks protocol {version_text(PROTOCOL_VERSION)}, the request "
                f"{version_text(req.version)}", ErrorCode.UNSUPPORTED_PROTOCOL_VERSION))
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
        fence = 0 if spec.read_only else req.fence
        if fence:
            refused = self._fence_refusal(item, fence)
            if refused is not None:
                return refused
        key = "" if spec.read_only else req.key
        if key:
            results = self.results
            if not results.key_fits(key):
                self.counters["idempotency_key_too_long"] += 1
                self.counters["rejected"] += 1
                return self._finish(item, InboundEvent.REJECT, self._error_reply(
                    req.id, "KeyTooLong", f"{req.method!r}: an idempotency key is at most "
                    f"{results.max_key_bytes} bytes", ErrorCode.KEY_TOO_LONG))
            recorded = results.lookup(self._key_scope(item.route, req), req.method, key)
            if recorded is RUNNING:
                self.counters["idempotent_in_progress"] += 1
                self.counters["rejected"] += 1
                return self._finish(item, InboundEvent.REJECT, self._error_reply(
                    req.id, "InProgress", f"{req.method!r} with idempotency key {key[:64]!r} "
                    "is still running", ErrorCode.IN_PROGRESS))
            if recorded is not None:
                self.counters["idempotent_replays"] += 1
                item.go(InboundEvent.START)
                return self._finish(item, InboundEvent.REPLY, Reply(
                    req.id, self.rank, self.incarnation, recorded.ok,
                    msgspec.Raw(recorded.result) if recorded.ok else self._nil, recorded.error))
        payload: Any
        if spec.payload_optional and req.payload == self._nil:
            payload = _NONE  # no payload sent: the handler's default applies
        else:
            try:
                payload = self.codec.decode_value(req.payload, spec.payload_type)
            except PayloadTypeError as exc:
                self.counters["rejected"] += 1
                return self._finish(item, InboundEvent.REJECT, self._error_reply(
                    req.id, "InvalidPayload", f"{req.method!r}: {exc}",
                    ErrorCode.INVALID_PAYLOAD))
            if not spec.takes_payload and payload is not None:
                self.counters["rejected"] += 1
                return self._finish(item, InboundEvent.REJECT, self._error_reply(
                    req.id, "InvalidPayload", f"{req.method!r} takes no payload",
                    ErrorCode.INVALID_PAYLOAD))
        if key and not self.results.start(self._key_scope(item.route, req), req.method, key,
                                          self.clock()):
            self.counters["idempotency_cache_full"] += 1
            self.counters["rejected"] += 1
            return self._finish(item, InboundEvent.REJECT, self._error_reply(
                req.id, "CacheFull", f"{req.method!r}: the idempotency cache has no room for "
                "a new key (every entry is within its retry window); not run, retry later",
                ErrorCode.CACHE_FULL))
        if fence:
            self.fences.accept(fence)
        item.go(InboundEvent.START)
        return spec, payload

    def _fence_refusal(self, item: _Inbound, fence: int) -> Reply | None:
        """The Rejected reply of a request whose (non-zero) fence the guard refuses."""
        req = item.request
        verdict = self.fences.verdict(fence, item.received)
        if verdict is FenceVerdict.ADMIT:
            return None
        self.counters["rejected"] += 1
        if verdict is FenceVerdict.STALE:
            self.counters["fenced"] += 1
            return self._finish(item, InboundEvent.REJECT, self._error_reply(
                req.id, "Fenced", f"{req.method!r}: fencing token {fence} is older than "
                f"{self.fences.high}, already accepted", ErrorCode.FENCED))
        self.counters["fence_out_of_range"] += 1
        return self._finish(item, InboundEvent.REJECT, self._error_reply(
            req.id, "FenceOutOfRange", f"{req.method!r}: fencing token {fence} is outside "
            f"1..{self.fences.limit(item.received)} (microseconds since the epoch, at most "
            f"{self.fences.window:g} s ahead of this engine's clock)",
            ErrorCode.FENCE_OUT_OF_RANGE))

    def _run_fast(self, req: Request, route: Route, now: float) -> bytes | Reply | None:
        """The common case, start to reply, for a sync inline method: a request for
        this rank, fresh, unkeyed, whose fence the guard admits, whose payload
        decodes as the method's type. Exactly what :meth:`_admit` then running the
        handler does (same counters, states, fence move and reply), minus the
        per-request lookups.
        None, having changed nothing, for anything else: the general path takes it.

        ``now`` is the clock read when the request was accepted (:meth:`_accept`),
        right before. The reply comes back encoded (bytes, within the codec's size
        limit, for the transport's ``send_encoded_nowait``) when the endpoint has
        that hot path and the handler succeeded; else as a :class:`Reply`."""
        fast = self._fast.get(req.method)
        if fast is None or req.rank != self.rank or req.key or req.version >> 8 != PROTOCOL_MAJOR:
            return None
        spec, encode, decode = fast
        if req.deadline and now > req.deadline:
            return None
        fence = 0 if spec.read_only else req.fence
        if fence and not self.fences.admissible(fence, now):
            return None  # the general path refuses it (_fence_refusal)
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
        if fence:
            self.fences.accept(fence)
        rid = req.id
        running = self.running
        running[rid] = (req.method, time.monotonic())
        if self.shared_heartbeats:
            self._running_routes[rid] = route
        # the trace carrier: set only when there is one to set, or one to clear
        trace = req.trace
        trace_token = (current_trace.set(trace)
                       if trace is not None or current_trace.get() is not None else None)
        token = _current_request.set((self, rid))
        done: bytes | Reply
        try:
            result = spec.handler(*args)
        except Exception as exc:
            done = self._exception_reply(_Inbound.running(req, now), exc)
        else:
            try:
                data = encode(result)
            except Exception:  # says ResultNotEncodable
                done = self._result_reply(_Inbound.running(req, now), result)
            else:
                self.states[_REPLIED] += 1
                ok_reply = self._ok_reply
                if ok_reply is not None:
                    done = ok_reply(rid, data)
                    if len(done) > self._max_reply_size:  # _fit makes it ReplyTooLarge
                        done = Reply(rid, self.rank, self.incarnation, True, msgspec.Raw(data))
                else:
                    done = Reply(rid, self.rank, self.incarnation, True, msgspec.Raw(data))
        finally:
            _current_request.reset(token)
            if trace_token is not None:
                current_trace.reset(trace_token)
            running.pop(rid, None)
            if self._progress:
                self._progress.pop(rid, None)
            if self._running_routes:
                self._running_routes.pop(rid, None)
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

    def _accept(self, req: Request, route: Route) -> float | None:
        """Count a received request; None for a duplicate of an id the same
        route sent (dropped, counted), else the clock now (also
        :attr:`client_last_seen`): the one clock read of a request the fast
        path takes."""
        counters = self.counters
        counters["received"] += 1
        if self.duplicates.seen(route, req.id):
            counters["duplicates"] += 1
            return None
        now = self.client_last_seen = self.clock()
        return now

    def _classify(self, event: Any) -> _Inbound | _BadFrameReply | None:
        """Turn a transport event into work (an _Inbound), an immediate reply, or nothing."""
        if type(event) is Received:
            env = event.envelope
            if type(env) is Request:
                now = self._accept(env, event.route)
                return None if now is None else _Inbound(env, event.route, now)
            self.counters["received"] += 1
            if type(env) is Heartbeat:
                if env.version >> 8 != PROTOCOL_MAJOR:  # a client this engine cannot serve
                    self.counters["protocol_version_refused"] = (
                        self.counters.get("protocol_version_refused", 0) + 1)
                    return None
                self.counters["heartbeats_received"] += 1
                self.client_last_seen = self.clock()
                return None
            self.counters["dropped_wrong_type"] += 1
            return None
        self.counters["received"] += 1
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
