"""The engine's per-wake-up batch and its encoded replies.

* ``poll()`` takes queued events one at a time, in arrival order, bad frames
  included, and handles each (its reply sent) before taking the next, up to
  ``max_messages``, until a take finds nothing (a ZMQ engine transport's
  ``receive_one`` asks the socket's ``EVENTS`` first, so that take raises
  nothing). A transport with the default ``receive_one`` is read with its
  ``try_receive`` until it finds nothing.
* Over a real ZMQ transport (where replies go out as encoded bytes) every
  kind of request gets its one reply.
* The trace carrier a handler sees, and that it is restored.
"""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import pytest
import zmq
from test_request_kinds import check, methods, requests  # the same stream and methods

from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.tracing import current_trace
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.envelope import Heartbeat, Reply, Request
from ctlwire.transports.errors import TransportClosed
from ctlwire.transports.memory import MemoryNetwork
from ctlwire.transports.transport import Dropped, EngineTransport, Received
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport

_counter = itertools.count()


class _Pair:
    """A raw ROUTER (the client) and an engine endpoint on a ZMQ DEALER, inproc; the
    transport opened for a synchronous loop, or (``mechanism="async-socket"``)
    entered for an event loop and then polled."""

    def __init__(self, mechanism: str = "sync-socket", **kw: Any) -> None:
        self.address = f"inproc://engine-batch-{next(_counter)}"
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.bind(self.address)
        self.transport = ZmqDealerEngineTransport(self.address, 0, context=self.ctx)
        self.codec = self.transport.codec
        self.ep = EngineEndpoint(self.transport, heartbeat_interval=None, beacon=False,
                                 clock=lambda: 1000.0, incarnation=1, **kw)
        methods(self.ep)
        if mechanism == "async-socket":
            anyio.run(self.transport.__aenter__)
        self.ep.open()

    def send(self, *frames: bytes) -> None:
        self.router.send_multipart([b"rank-0", *frames])

    def replies(self, expect: int) -> list[bytes]:
        got: list[bytes] = []
        for _ in range(1000):
            if len(got) >= expect:
                break
            self.ep.poll()
            while self.router.poll(0):
                got.append(self.router.recv_multipart()[1])
            if len(got) < expect:
                self.transport.wait_readable(0.01)
        return got

    def close(self) -> None:
        self.ep.close()
        self.router.close(0)
        self.ctx.term()


def _settle(pair: _Pair) -> None:
    """Wait until the messages sent are readable at the engine (inproc queues them
    at once; the pipe's activation is processed by the next socket call)."""
    for _ in range(500):
        if pair.transport.wait_readable(0.01):
            break


MECHANISMS = ["sync-socket", "async-socket"]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_receive_one_takes_each_queued_message_as_its_typed_event_in_order(
        mechanism: str) -> None:
    """``receive_one`` hands over each queued message as its typed event, in
    order, then None; a message of several parts is one framing drop, not a
    request."""
    pair = _Pair(mechanism)
    try:
        codec = pair.codec
        for i in range(1, 3):
            pair.send(codec.encode(Request(i, 0, "flush", codec.encode_value(None))))
        pair.send(codec.encode(Request(9, 0, "flush", codec.encode_value(None))), b"x")
        pair.send(b"\xc1junk")
        pair.send(codec.encode(Request(3, 0, "flush", codec.encode_value(None))))
        pair.send(codec.encode(Heartbeat(0, 1)))
        _settle(pair)
        events = []
        while (event := pair.transport.receive_one()) is not None:
            events.append(event)
        assert pair.transport.receive_one() is None
        assert [type(e) for e in events] == [Received, Received, Dropped, Dropped, Received,
                                             Received]
        assert [e.envelope.id for e in events if isinstance(e, Received)
                and isinstance(e.envelope, Request)] == [1, 2, 3]
        assert isinstance(events[-1], Received) and isinstance(events[-1].envelope, Heartbeat)
        assert [e.reason for e in events if isinstance(e, Dropped)] == ["framing", "malformed"]
    finally:
        pair.close()
    with pytest.raises(TransportClosed):
        pair.transport.receive_one()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_frame_that_is_not_an_envelope_is_parsed_by_the_fast_decoder_once(
        mechanism: str) -> None:
    """The shortcut decoder's refusal goes straight to the typed verdict: a
    malformed frame (a peer's, up to the size limit) is not parsed twice."""
    pair = _Pair(mechanism)
    fast = pair.transport._fast_decode
    assert fast is not None
    tried: list[bytes] = []

    def counting(data: bytes) -> Any:
        tried.append(data)
        return fast(data)

    pair.transport._fast_decode = counting
    try:
        pair.send(b"\xc1junk")
        _settle(pair)
        event = pair.transport.receive_one()
        assert isinstance(event, Dropped) and event.reason == "malformed"
        assert tried == [b"\xc1junk"]
    finally:
        pair.close()


def _record_receives(monkeypatch: pytest.MonkeyPatch, ep: EngineEndpoint,
                     record: Any) -> None:
    """Call ``record("take", got)`` at every receive ``poll()`` makes (``got``: an
    event, not None)."""
    take_one = ep._take_one

    def one() -> Any:
        event = take_one()
        record("take", event is not None)
        return event

    monkeypatch.setattr(ep, "_take_one", one)


def _request(codec: Any, i: int) -> bytes:
    return codec.encode(Request(i, 0, "flush", codec.encode_value(None), 0.0, i, 9))


def test_poll_takes_up_to_max_messages_and_stops_when_nothing_more_is_queued(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A poll takes events up to ``max_messages``, or until a take finds the
    queue empty (one empty take per burst)."""
    pair = _Pair()
    try:
        calls: list[tuple[str, bool]] = []
        _record_receives(monkeypatch, pair.ep, lambda what, got: calls.append((what, got)))
        for i in range(1, 11):
            pair.send(_request(pair.codec, i))
        _settle(pair)
        assert pair.ep.poll(max_messages=4) == 4
        assert calls == [("take", True)] * 4
        calls.clear()
        assert pair.ep.poll() == 6
        assert calls == [("take", True)] * 6 + [("take", False)]
        assert pair.ep.__dict__["ran"] == [("flush", None)] * 10
        calls.clear()
        assert pair.ep.poll() == 0  # nothing queued: one empty take
        assert pair.ep.poll(max_messages=0) == 0  # takes nothing
        assert calls == [("take", False)]
    finally:
        pair.close()


def test_poll_replies_to_a_lone_request_before_asking_whether_more_is_queued(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone request is answered before the transport is asked for another,
    and the poll ends on the empty take that follows."""
    pair = _Pair()
    try:
        seen: list[tuple[str, bool, int]] = []  # (what, result, replies sent before)
        _record_receives(monkeypatch, pair.ep, lambda what, got: seen.append(
            (what, got, pair.ep.counters["replied"])))
        pair.send(_request(pair.codec, 1))
        _settle(pair)
        assert pair.ep.poll() == 1
        assert seen == [("take", True, 0), ("take", False, 1)]
        assert len(pair.replies(1)) == 1
    finally:
        pair.close()


def test_poll_takes_what_queued_behind_the_first_event_in_the_same_poll() -> None:
    """What is queued behind the first event is taken by the same poll, in
    order; a request arriving after the poll ended is taken by the next one."""
    pair = _Pair()
    try:
        codec = pair.codec
        for i in (1, 2, 3):
            pair.send(_request(codec, i))
        _settle(pair)
        assert pair.ep.poll() == 3
        assert pair.ep.__dict__["ran"] == [("flush", None)] * 3
        assert [codec.decode(r).id for r in pair.replies(3)] == [1, 2, 3]
        pair.send(_request(codec, 4))
        _settle(pair)
        assert pair.ep.poll() == 1 and pair.ep.counters["replied"] == 4
    finally:
        pair.close()


def test_poll_with_the_default_receive_one_reads_try_receive_until_it_finds_nothing() -> None:
    net = MemoryNetwork()
    transport = net.engine_transport(0)
    assert type(transport).receive_one is EngineTransport.receive_one
    ep = EngineEndpoint(transport, heartbeat_interval=None)
    methods(ep)
    client = net.client_transport()
    ep.open()
    for i in range(1, 6):
        client.send_nowait(0, Request(i, 0, "flush", net.codec.encode_value(None), 0.0, i, 9))
    assert ep.poll(max_messages=3) == 3
    assert ep.poll() == 2
    assert ep.poll() == 0


def test_every_kind_of_request_gets_its_one_reply_over_zmq() -> None:
    pair = _Pair()
    try:
        envs = requests(pair.codec)
        for env in envs:
            pair.send(pair.codec.encode(env))
        frames = pair.replies(len(envs) - 1)  # one duplicate
        assert not pair.ep.running
        check([r for f in frames if isinstance(r := pair.codec.decode(f), Reply)],
              pair.ep.__dict__["ran"])
    finally:
        pair.close()


def test_trace_carrier_is_set_cleared_and_restored() -> None:
    pair = _Pair()
    seen: list[dict[str, str] | None] = []

    @pair.ep.method()
    def traced() -> None:
        seen.append(current_trace.get())

    @pair.ep.method()
    def traced_fails() -> None:
        seen.append(current_trace.get())
        raise RuntimeError("no")

    try:
        codec = pair.codec
        nil = codec.encode_value(None)
        stale = current_trace.set({"stale": "1"})  # whatever the caller's context holds
        try:
            pair.send(codec.encode(Request(1, 0, "traced", nil, 0.0, 1, 9)))
            pair.send(codec.encode(Request(2, 0, "traced", nil, 0.0, 2, 9, {"t": "2"})))
            pair.send(codec.encode(Request(3, 0, "traced_fails", nil, 0.0, 3, 9, {"t": "3"})))
            replies = [codec.decode(f) for f in pair.replies(3)]
            assert current_trace.get() == {"stale": "1"}  # restored after each handler
        finally:
            current_trace.reset(stale)
        assert seen == [None, {"t": "2"}, {"t": "3"}]
        assert [r.ok for r in replies if isinstance(r, Reply)] == [True, True, False]
        assert current_trace.get() is None
    finally:
        pair.close()


def test_a_transport_opened_for_a_sync_loop_is_its_opening_thread_s_alone() -> None:
    """Opened with ``open()`` (a synchronous loop), the socket is used directly by the
    thread that opened it: another thread is refused, and so is an event loop
    (``async with`` raises RuntimeError); entered with ``async with``, it serves the
    synchronous calls too, through the socket wrapper."""
    import threading

    from ctlwire.transports.errors import ForeignThreadError

    pair = _Pair()
    try:
        transport, codec = pair.transport, pair.codec
        reply = codec.encode(Reply(1, 0, 1, True, codec.encode_value(None)))
        errors: list[BaseException] = []

        def foreign() -> None:
            try:
                transport.send_encoded_nowait(None, reply)
            except BaseException as exc:
                errors.append(exc)

        th = threading.Thread(target=foreign)
        th.start()
        th.join()
        assert len(errors) == 1 and isinstance(errors[0], ForeignThreadError)
        transport.send_encoded_nowait(None, reply)
        assert pair.router.poll(5000) and pair.router.recv_multipart()[1] == reply
        with pytest.raises(RuntimeError, match="synchronous loop"):
            anyio.run(transport.__aenter__)
    finally:
        pair.close()
    served = _Pair("async-socket")
    try:
        served.transport.send_encoded_nowait(None, reply)  # through the wrapper, same frames
        assert served.router.poll(5000) and served.router.recv_multipart()[1] == reply

        async def receive_one() -> Any:
            with anyio.fail_after(10):
                return await served.transport.receive()

        served.send(codec.encode(Heartbeat(0, 1)))
        event = anyio.run(receive_one)
        assert isinstance(event, Received) and isinstance(event.envelope, Heartbeat)
    finally:
        served.close()


class _FullRoute(EngineTransport):
    """An engine transport taking encoded replies whose route ``b"hostile"`` is
    always full (WouldBlock) and ``b"gone"`` unroutable."""

    rank = 0

    def __init__(self) -> None:
        self.codec = MsgpackCodec()
        self.inbox: list[Any] = []
        self.sent: list[tuple[Any, int]] = []

    def try_receive(self) -> Any:
        return self.inbox.pop(0) if self.inbox else None

    async def receive(self) -> Any:
        raise TransportClosed("polled only")

    def send_encoded_nowait(self, route: Any, data: bytes) -> None:
        from ctlwire.transports.errors import Unroutable, WouldBlock

        if route == b"hostile":
            raise WouldBlock("full")
        if route == b"gone":
            raise Unroutable(0, "gone")
        reply = self.codec.decode(data)
        assert isinstance(reply, Reply)
        self.sent.append((route, reply.id))

    def heartbeat_routes(self) -> list[Any]:
        return []


def test_encoded_reply_to_a_full_or_gone_route_is_queued_or_counted() -> None:
    transport = _FullRoute()
    ep = EngineEndpoint(transport, heartbeat_interval=None, max_unread_replies=4)
    ep.register("echo", lambda v: v, payload_type=Any)
    codec = transport.codec
    for i in range(1, 11):
        route = (b"hostile", b"legit", b"gone")[i % 3]
        transport.inbox.append(Received(Request(i, 0, "echo", codec.encode_value(i), client=1),
                                        route=route))
    assert ep.poll() == 10
    assert transport.sent == [(b"legit", i) for i in (1, 4, 7, 10)]
    assert ep.outbox_replies == 3  # 3, 6, 9 wait for room (bound 4)
    assert [codec.decode(r).id for r, _ in ep.outbox.queues[b"hostile"]] == [3, 6, 9]
    assert ep.counters["reply_send_failures"] == 3 and ep.counters["replied"] == 4


def test_wait_readable_blocks_until_a_message_is_queued_and_raises_once_closed() -> None:
    """The sync loop's wait: False after ``timeout`` with nothing queued, True at
    once while a message is queued (it takes nothing); TransportClosed after close."""
    import time

    pair = _Pair()
    try:
        started = time.monotonic()
        assert pair.transport.wait_readable(0.05) is False
        assert time.monotonic() - started >= 0.04
        pair.send(_request(pair.codec, 1))
        assert pair.transport.wait_readable(10.0) is True
        assert pair.transport.wait_readable(0.0) is True  # still queued: nothing taken
        assert pair.ep.poll() == 1
        assert pair.transport.wait_readable(0.0) is False
    finally:
        pair.close()
    with pytest.raises(TransportClosed):
        pair.transport.wait_readable(0.0)
