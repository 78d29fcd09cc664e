"""Replies on their way out of an engine: a reply that would not fit the codec
becomes a small ``ReplyTooLarge`` error; in poll mode a reply that finds its
client's pipe full waits in a queue of that client's route, bounded per route and
in total; in serve mode it waits at most ``reply_send_timeout`` for room, and a
route that timed out is marked stalled (its replies dropped at once, counted)
until it takes one again."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable

import anyio
import anyio.abc
import msgspec

from ctlwire.kernel.engine_base import EngineBase
from ctlwire.kernel.engine_registry import ErrorCode
from ctlwire.transports.codec import Codec
from ctlwire.transports.envelope import Envelope, Reply
from ctlwire.transports.errors import (
    OversizedFrame,
    TransportError,
    Unroutable,
    WouldBlock,
)
from ctlwire.transports.rate_limited_log import RateLimitedLog
from ctlwire.transports.transport import Route

__all__ = ["ReplyOutbox", "ok_reply_encoder"]


class ReplyOutbox(EngineBase):
    """The reply-sending part of an endpoint (see the module docstring)."""

    # replies waiting for room, per route: encoded where the transport takes bytes
    _outbox: OrderedDict[Route, deque[tuple[Reply | bytes, int]]]
    _outbox_route_bytes: dict[Route, int]
    _outbox_bytes: int
    max_unread_replies: int
    max_unread_bytes: int
    max_outbox_bytes: int
    reply_send_timeout: float
    _stalled: OrderedDict[Route, None]
    outbox_peak_bytes: int
    unsent_log: RateLimitedLog
    # the reply hot path, when the transport takes encoded envelopes and the codec
    # has a shortcut encoder (else _encode_envelope is None and _send_encoded is
    # never called): see EngineEndpoint.__init__
    _encode_envelope: Callable[[Envelope], bytes] | None
    _send_encoded: Callable[[Route, bytes], None]

    def _log_unsent(self, exc: Exception) -> None:
        """A reply could not be sent (its client is gone, or the transport failed):
        counted by the caller; logged at most once per kind of failure per
        interval, with how many were left out (a departed client's replies would
        otherwise log one line each)."""
        self.unsent_log.warning(type(exc).__name__, "engine %d: reply not sent: %r",
                                self.rank, exc)

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

    def _set_ok_reply(self) -> None:
        """The fast path's encoded OK reply: only where replies go out encoded
        (``send_encoded_nowait``), for this endpoint's rank and incarnation."""
        self._ok_reply = None
        if self._encode_envelope is not None:
            self._ok_reply = ok_reply_encoder(self.codec, self.rank, self.incarnation)

    def _reply_of(self, data: bytes) -> Reply:
        """The Reply a fast-path reply encoded (for the rare paths that queue one)."""
        reply = self.codec.decode(data)
        assert type(reply) is Reply
        return reply

    def _send_data_sync(self, route: Route, data: bytes) -> None:
        """Poll mode: :meth:`_send_sync` of a reply the fast path encoded (within the
        size limit, so nothing to fit)."""
        if self._outbox and route in self._outbox:
            self._enqueue_data(route, data)  # behind the replies already waiting for it
            self._flush_route(route)
            return
        try:
            self._send_encoded(route, data)
        except WouldBlock:
            self._enqueue_data(route, data)
        except (Unroutable, TransportError) as exc:
            self.counters["reply_send_failures"] += 1
            self._log_unsent(exc)
        else:
            self.counters["replied"] += 1

    def _send_sync(self, route: Route, reply: Reply) -> None:
        encode = self._encode_envelope
        if encode is not None:
            # the hot path: encode once, check the exact size (what _fit then the
            # transport's encode would check), send the bytes; else the path below
            data = encode(reply)
            if len(data) <= self.codec.max_message_size:
                self._send_data_sync(route, data)
                return
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
            self._log_unsent(exc)

    @staticmethod
    def _reply_size(reply: Reply) -> int:
        err = reply.error
        return 64 + len(reply.result) + (len(err.type) + len(err.message) if err else 0)

    def _enqueue(self, route: Route, reply: Reply) -> None:
        """Queue ``reply`` (fitted) for ``route``, whose pipe is full; kept encoded
        where the transport takes encoded replies."""
        encode = self._encode_envelope
        if encode is not None:
            data = encode(reply)
            if len(data) <= self.codec.max_message_size:
                self._enqueue_item(route, data, len(data))
                return
        self._enqueue_item(route, reply, self._reply_size(reply))

    def _enqueue_data(self, route: Route, data: bytes) -> None:
        """Queue an encoded reply for ``route``, whose pipe is full."""
        self._enqueue_item(route, data, len(data))

    def _enqueue_item(self, route: Route, item: Reply | bytes, size: int) -> None:
        """Queue ``item`` of ``size`` bytes for ``route``; drop and count it when the
        route's queue (``max_unread_replies``, ``max_unread_bytes``) or the whole
        outbox (``max_outbox_bytes``) would pass its bound."""
        queue = self._outbox.get(route)
        held = self._outbox_route_bytes.get(route, 0)
        if ((queue is not None and len(queue) >= self.max_unread_replies)
                or held + size > self.max_unread_bytes
                or self._outbox_bytes + size > self.max_outbox_bytes):
            self.counters["replies_dropped_unread"] += 1
            return
        if queue is None:
            queue = self._outbox[route] = deque()
        queue.append((item, size))
        self._outbox_route_bytes[route] = held + size
        self._outbox_bytes += size
        self.outbox_peak_bytes = max(self.outbox_peak_bytes, self._outbox_bytes)

    def _flush_route(self, route: Route) -> None:
        """Send ``route``'s waiting replies until its pipe is full again."""
        queue = self._outbox.get(route)
        while queue:
            item, size = queue[0]
            try:
                if type(item) is bytes:
                    self._send_encoded(route, item)
                else:
                    assert isinstance(item, Reply)
                    self.transport.send_nowait(route, item)
                self.counters["replied"] += 1
            except WouldBlock:
                return
            except (Unroutable, TransportError) as exc:
                self.counters["reply_send_failures"] += 1
                self._log_unsent(exc)
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

    def _send_now(self, route: Route, reply: Reply | None, data: bytes | None = None) -> bool:
        """Serve mode: send ``reply`` (already fitted) if the client's pipe has room,
        or drop it if that client is marked stalled, or count a failure. False
        when it has to wait for room. ``data``: the reply already encoded (within
        the size limit), sent with the transport's ``send_encoded_nowait`` (then
        ``reply`` may be None)."""
        try:
            if data is None:
                assert reply is not None
                self.transport.send_nowait(route, reply)
            else:
                self._send_encoded(route, data)
        except WouldBlock:
            if route in self._stalled:
                # this client stopped reading: do not make every request wait for it
                self.counters["replies_dropped_unread"] += 1
                return True
            return False
        except (Unroutable, TransportError) as exc:
            self.counters["reply_send_failures"] += 1
            self._log_unsent(exc)
            return True
        if self._stalled:
            self._stalled.pop(route, None)
        self.counters["replied"] += 1
        return True

    def _fit_encoded(self, reply: Reply) -> tuple[Reply, bytes | None]:
        """``reply`` fitted (see :meth:`_fit`), and encoded for the transport's
        ``send_encoded_nowait`` when the endpoint has that hot path (else None)."""
        encode = self._encode_envelope
        if encode is not None:
            data = encode(reply)
            if len(data) <= self.codec.max_message_size:
                return reply, data
        return self._fit(reply), None

    async def _send_async(self, route: Route, reply: Reply) -> None:
        reply, data = self._fit_encoded(reply)
        if self._send_now(route, reply, data):
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
            self._log_unsent(exc)


def ok_reply_encoder(codec: Codec, rank: int, incarnation: int
                     ) -> Callable[[int, bytes], bytes] | None:
    """For the engine's fast path: ``encode(request_id, result)`` giving exactly the
    bytes ``codec.encode(Reply(request_id, rank, incarnation, True, Raw(result)))``
    gives (``result`` an encoded value), by splicing the request id and the result
    into the constant rest, or None when ``codec`` has no such shortcut.

    msgpack only (the default codec, array-like tagged structs): the layout is
    checked against the codec's own encoder here, for ids of every integer width
    and results of several sizes; any difference and the shortcut is refused."""
    encoder = codec.fast_envelope_encoder()
    if encoder is None or codec.name != "msgpack":
        return None
    encode_int = msgspec.msgpack.Encoder().encode
    # [tag "r", id, rank, incarnation, ok true, result, error nil]
    head = b"\x97\xa1r"
    mid = encode_int(rank) + encode_int(incarnation) + b"\xc3"
    tail = b"\xc0"
    join = b"".join

    def encode(request_id: int, result: bytes) -> bytes:
        return join((head, encode_int(request_id), mid, result, tail))

    try:
        for rid in (0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1,
                    2**64 - 1):
            for result in (b"\xc0", b"\x01", b"\xa3abc", bytes(codec.encode_value("x" * 300))):
                reply = Reply(rid, rank, incarnation, True, msgspec.Raw(result))
                if encoder(reply) != encode(rid, result):
                    return None
    except Exception:
        return None
    return encode
