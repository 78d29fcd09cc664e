"""The reply outbox alone, over a transport stub whose routes are full, take
replies, or are gone: its bounds in replies and bytes per route and in bytes in
total, the order of a route's replies, and oversized replies."""

from __future__ import annotations

import time
from typing import Any

import msgspec

from ctlwire.kernel.engine.outbox import ReplyOutbox
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.envelope import Reply
from ctlwire.transports.errors import TransportClosed, Unroutable, WouldBlock
from ctlwire.transports.transport import EngineTransport


class Routes(EngineTransport):
    """Routes named ``full*`` never take a reply, ``gone`` is unroutable, others take."""

    def __init__(self, max_message_size: int = 1 << 20) -> None:
        self.codec = MsgpackCodec(max_message_size=max_message_size)
        self.rank = 0
        self.sent: list[tuple[Any, int]] = []
        self.full: set[Any] = set()

    def try_receive(self) -> Any:
        return None

    async def receive(self) -> Any:
        raise TransportClosed("a stub")

    def _take(self, route: Any, reply_id: int) -> None:
        if route == b"gone":
            raise Unroutable(0, "gone")
        if route in self.full or bytes(route).startswith(b"full"):
            raise WouldBlock()
        self.sent.append((route, reply_id))

    def send_encoded_nowait(self, route: Any, data: bytes) -> None:
        reply = self.codec.decode(data)
        assert isinstance(reply, Reply)
        self._take(route, reply.id)



def reply(rid: int, size: int = 0) -> Reply:
    return Reply(rid, 0, 1, True, msgspec.Raw(MsgpackCodec().encode_value("x" * size)))


def test_bytes_queued_for_one_full_route_stay_under_max_unread_bytes() -> None:
    transport = Routes()
    outbox = ReplyOutbox(transport, max_unread_replies=10_000,
                         max_unread_bytes=100_000, max_outbox_bytes=10 << 20)
    for rid in range(1, 41):
        outbox.send(b"full", reply(rid, 10_000))
        assert outbox.bytes <= 100_000
    assert outbox.peak_bytes <= 100_000 < outbox.peak_bytes + 10_100  # filled to its bound
    dropped = outbox.counters["replies_dropped_unread"]
    assert outbox.replies + dropped == 40 and dropped == 40 - outbox.replies > 0


def test_each_full_route_holds_exactly_max_unread_replies() -> None:
    """The count bound, per route: the first ``max_unread_replies`` replies wait,
    every later one is dropped and counted; another route has its own bound."""
    transport = Routes()
    outbox = ReplyOutbox(transport, max_unread_replies=3)
    transport.full.update((b"a", b"b"))
    for rid in range(1, 6):
        outbox.send(b"a", reply(rid))
        outbox.send(b"b", reply(100 + rid))
    assert [len(q) for q in outbox.queues.values()] == [3, 3] and outbox.replies == 6
    assert outbox.counters["replies_dropped_unread"] == 4
    transport.full.clear()
    outbox.flush()
    assert transport.sent == [(b"a", 1), (b"a", 2), (b"a", 3), (b"b", 101), (b"b", 102),
                              (b"b", 103)]
    assert not outbox.pending and outbox.bytes == 0


def test_the_total_across_several_full_routes_stays_under_max_outbox_bytes() -> None:
    transport = Routes()
    outbox = ReplyOutbox(transport, max_unread_replies=10_000,
                         max_unread_bytes=100_000, max_outbox_bytes=250_000)
    rid = 0
    for _ in range(20):
        for route in (*(b"full-%d" % i for i in range(8)), b"reader"):
            rid += 1
            outbox.send(route, reply(rid, 5_000))
            assert outbox.bytes <= 250_000
    assert outbox.bytes > 240_000 and outbox.peak_bytes <= 250_000
    assert outbox.replies + outbox.counters["replies_dropped_unread"] == 8 * 20
    assert [r for r, _ in transport.sent] == [b"reader"] * 20  # still answered


def test_a_route_that_takes_again_gets_its_replies_in_order_behind_the_queue() -> None:
    transport = Routes()
    outbox = ReplyOutbox(transport)
    transport.full.add(b"slow")
    for rid in (1, 2, 3):
        outbox.send(b"slow", reply(rid))
    outbox.send(b"gone", reply(9))
    assert outbox.pending and outbox.replies == 3 and transport.sent == []
    transport.full.clear()
    outbox.send(b"slow", reply(4))  # behind the three waiting, not ahead of them
    assert transport.sent == [(b"slow", i) for i in (1, 2, 3, 4)]
    assert not outbox.pending and outbox.bytes == 0
    assert outbox.counters["replied"] == 4 and outbox.counters["reply_send_failures"] == 1


def test_a_reply_too_large_for_the_codec_becomes_reply_too_large() -> None:
    transport = Routes(max_message_size=4096)
    outbox = ReplyOutbox(transport)
    transport.full.add(b"a")
    outbox.send(b"a", reply(1, 10_000))
    item, _ = outbox.queues[b"a"][0]
    queued = transport.codec.decode(item) if isinstance(item, bytes) else item
    assert isinstance(queued, Reply) and queued.error is not None
    assert queued.error.type == "ReplyTooLarge" and outbox.counters["replies_too_large"] == 1


def test_a_route_that_takes_no_reply_for_the_timeout_is_stalled_until_it_takes_one() -> None:
    """Replies wait for a full route (nothing that sends them waits); once it took
    none for ``reply_send_timeout`` they are dropped and counted, and so is every
    later reply that finds it full -- until it takes one again."""
    transport = Routes()
    outbox = ReplyOutbox(transport, reply_send_timeout=0.05)
    transport.full.add(b"r")
    outbox.send(b"r", reply(1))
    outbox.send(b"r", reply(2))
    outbox.send(b"ok", reply(3))  # another route is not held up
    assert outbox.replies == 2 and transport.sent == [(b"ok", 3)]
    start = time.monotonic()
    assert outbox.expire(start) == 0 and outbox.replies == 2  # not yet
    assert outbox.expire(start + 0.05) == 1
    assert b"r" in outbox.stalled and outbox.counters["replies_dropped_unread"] == 2
    assert outbox.replies == 0 and outbox.bytes == 0 and not outbox.queues
    outbox.send(b"r", reply(4))  # stalled and full: dropped at once, nothing waits
    assert outbox.counters["replies_dropped_unread"] == 3 and not outbox.queues
    transport.full.discard(b"r")
    outbox.send(b"r", reply(5))  # it reads again
    assert transport.sent[-1] == (b"r", 5) and b"r" not in outbox.stalled
