"""Replies on their way out of an engine: sent now, or waiting for room in their
client's queue; nothing that sends a reply ever waits.

Guarantees:

* A reply that would not fit the codec becomes a small ``ReplyTooLarge`` error
  (counted in ``replies_too_large``): the caller gets an answer, not a timeout.
* :meth:`ReplyOutbox.send` sends now or, when the client's pipe is full, queues
  the reply for that client's route only, behind that route's earlier replies:
  a route's queue holds at most ``max_unread_replies`` replies and
  ``max_unread_bytes`` bytes, all queues together at most ``max_outbox_bytes``;
  a reply beyond is dropped and counted (``replies_dropped_unread``).
  :meth:`ReplyOutbox.flush` sends what each route has room for; a full route
  does not hold up the others. A poll loop flushes as it polls; a serving engine
  in a task of its own.
* **A client that stopped reading** (:meth:`ReplyOutbox.expire`): a route whose
  waiting replies made no progress for ``reply_send_timeout`` is marked stalled,
  its queue dropped (counted); a later reply to it that finds its pipe full is
  dropped at once, until it takes one again.
* A reply to a departed client, or one the transport fails to send, is counted
  (``reply_send_failures``) and logged at most once per kind per interval.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from ctlwire.transports.envelope import ErrorInfo, Reply
from ctlwire.transports.error_codes import ErrorCode
from ctlwire.transports.errors import OversizedFrame, TransportError, Unroutable, WouldBlock
from ctlwire.transports.rate_limited_log import RateLimitedLog
from ctlwire.transports.transport import EngineTransport, Route

__all__ = ["ReplyOutbox"]

_MAX_STALLED = 4096  # routes remembered as stalled (oldest forgotten first)


class ReplyOutbox:
    """Sends replies, and holds those that wait for room; see the module docstring."""

    def __init__(self, transport: EngineTransport, *, max_unread_replies: int = 1024,
                 max_unread_bytes: int = 4 << 20, max_outbox_bytes: int = 32 << 20,
                 reply_send_timeout: float = 1.0,
                 log: logging.Logger | None = None) -> None:
        self.transport = transport
        self.codec = transport.codec
        self.max_unread_replies = max_unread_replies
        self.max_unread_bytes = max_unread_bytes
        self.max_outbox_bytes = max_outbox_bytes
        self.reply_send_timeout = reply_send_timeout
        self.counters = {"replied": 0, "reply_send_failures": 0, "replies_dropped_unread": 0,
                         "replies_too_large": 0}
        self.bytes = 0
        self.peak_bytes = 0
        self.log = log or logging.getLogger("ctlwire.engine")
        #: replies that could not be sent: one line per kind of failure per interval
        self.unsent_log = RateLimitedLog(self.log)
        #: replies waiting for room, per route: (encoded, its size); empty: none wait
        self.queues: OrderedDict[Route, deque[tuple[bytes, int]]] = OrderedDict()
        self._route_bytes: dict[Route, int] = {}
        #: route -> when its queue last made progress (``time.monotonic``)
        self._since: dict[Route, float] = {}
        self.stalled: OrderedDict[Route, None] = OrderedDict()
        # a reply is encoded once, here: by the codec's encoder without the size
        # check where it has one (the check is made here, once)
        self._fast_encode: Callable[[Reply], bytes] | None = self.codec.fast_envelope_encoder()
        self._max_size = self.codec.max_message_size

    @property
    def pending(self) -> bool:
        """Replies wait for room."""
        return bool(self.queues)

    @property
    def replies(self) -> int:
        """Replies waiting for room."""
        return sum(len(q) for q in self.queues.values())

    @property
    def routes(self) -> int:
        return len(self.queues)

    # -- sending -------------------------------------------------------------------
    def send(self, route: Route, reply: Reply) -> None:
        """Send now, or queue behind ``route``'s waiting replies (bounded, see above);
        a stalled route's reply that finds its pipe full is dropped (counted)."""
        # the reply's one encoding, within the codec's limit (checked here, once)
        encode = self._fast_encode
        data = encode(reply) if encode is not None else None
        if data is None or len(data) > self._max_size:
            data = self.codec.encode(self._fit(reply))
        if self.queues and route in self.queues:
            self._enqueue(route, data)
            self._flush_route(route)
            return
        try:
            self.transport.send_encoded_nowait(route, data)
        except WouldBlock:
            if self.stalled and route in self.stalled:  # it stopped reading: nobody waits
                self.counters["replies_dropped_unread"] += 1
            else:
                self._enqueue(route, data)
        except (Unroutable, TransportError) as exc:
            self._unsent(exc)
        else:
            self.counters["replied"] += 1
            if self.stalled:
                self.stalled.pop(route, None)

    def flush(self) -> None:
        """Send every route's waiting replies that have room now."""
        for route in list(self.queues):
            self._flush_route(route)

    def _enqueue(self, route: Route, data: bytes) -> None:
        size = len(data)
        queue = self.queues.get(route)
        held = self._route_bytes.get(route, 0)
        if ((queue is not None and len(queue) >= self.max_unread_replies)
                or held + size > self.max_unread_bytes
                or self.bytes + size > self.max_outbox_bytes):
            self.counters["replies_dropped_unread"] += 1
            return
        if queue is None:
            queue = self.queues[route] = deque()
            self._since[route] = time.monotonic()
        queue.append((data, size))
        self._route_bytes[route] = held + size
        self.bytes += size
        self.peak_bytes = max(self.peak_bytes, self.bytes)

    def _flush_route(self, route: Route) -> None:
        queue = self.queues.get(route)
        sent = False
        send = self.transport.send_encoded_nowait
        while queue:
            data, size = queue[0]
            try:
                send(route, data)
                self.counters["replied"] += 1
                sent = True
            except WouldBlock:
                if sent:
                    self._since[route] = time.monotonic()
                    self.stalled.pop(route, None)
                return
            except (Unroutable, TransportError) as exc:
                self._unsent(exc)
            queue.popleft()
            self.bytes -= size
            self._route_bytes[route] -= size
        self._forget(route)
        if sent:
            self.stalled.pop(route, None)

    def _forget(self, route: Route) -> None:
        self.queues.pop(route, None)
        self._route_bytes.pop(route, None)
        self._since.pop(route, None)

    def expire(self, now: float | None = None) -> int:
        """Mark stalled every route whose waiting replies made no progress for
        ``reply_send_timeout`` (``now``: ``time.monotonic()``), dropping them
        (counted); how many routes."""
        if now is None:
            now = time.monotonic()
        timeout = self.reply_send_timeout
        expired = [route for route, since in self._since.items() if now - since >= timeout]
        for route in expired:
            queue = self.queues.get(route)
            if queue:
                self.counters["replies_dropped_unread"] += len(queue)
                self.bytes -= sum(size for _, size in queue)
            self._forget(route)
            self.stalled[route] = None
            self.stalled.move_to_end(route)
            while len(self.stalled) > _MAX_STALLED:
                self.stalled.popitem(last=False)
        return len(expired)

    # -- encoding --------------------------------------------------------------------
    def _fit(self, reply: Reply) -> Reply:
        """A reply the codec would refuse as oversized becomes a small
        ``ReplyTooLarge`` error; encodes only when a cheap bound says it may not fit."""
        err = reply.error
        bound = (len(reply.result) + 256 + reply.id.bit_length() // 3
                 + (6 * (len(err.type) + len(err.message)) if err is not None else 0))
        if bound <= self.codec.max_message_size:
            return reply
        try:
            self.codec.encode(reply)
        except OversizedFrame as exc:
            self.counters["replies_too_large"] += 1
            return Reply(reply.id, reply.rank, reply.incarnation, False,
                         self.codec.encode_value(None),
                         ErrorInfo("ReplyTooLarge", str(exc), ErrorCode.REPLY_TOO_LARGE))
        return reply

    def _unsent(self, exc: Exception) -> None:
        """A reply could not be sent (its client is gone, or the transport failed)."""
        self.counters["reply_send_failures"] += 1
        self.unsent_log.warning(type(exc).__name__, "engine: reply not sent: %r", exc)
