"""Every kind of request through an endpoint, in poll mode and in serve mode:
the one admission path gives each its one reply (a result, a refusal, a typed
error), the same in both modes; serve refuses what a full lane cannot take
(``Busy``) and runs a sync request at once meanwhile; one clock read per
request; replies go out as the bytes the outbox encoded (with the codec's
shortcut encoder or its ``encode``, the same bytes), and an oversized one becomes
``ReplyTooLarge``.
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import pytest
import zmq

from ctlwire.kernel.engine.endpoint import EngineEndpoint, report_progress
from ctlwire.transports.envelope import Reply, Request
from ctlwire.transports.memory import MemoryNetwork
from ctlwire.transports.transport import Received

pytestmark = pytest.mark.anyio
class Load(msgspec.Struct):
    weight: float


class Fails(Exception):
    code = 418


def methods(ep: EngineEndpoint) -> None:
    ran = ep.__dict__.setdefault("ran", [])

    @ep.method()
    def get_load(q: Load) -> float:
        ran.append(("get_load", q.weight))
        return q.weight * 2

    @ep.method()
    def flush() -> str:
        ran.append(("flush", None))
        return "flushed"

    @ep.method()
    def opt(x: int = 5) -> int:
        ran.append(("opt", x))
        return x

    @ep.method()
    def boom() -> None:
        ran.append(("boom", None))
        raise Fails("no")

    @ep.method()
    def unencodable() -> object:
        ran.append(("unencodable", None))
        return object()

    @ep.method()
    def progress() -> bool:
        return report_progress(0.5, "half")

    @ep.method()
    async def nap(x: int = 1) -> int:
        await anyio.sleep(0)
        return x


def requests(codec: Any) -> list[Request]:
    """Every kind of request the fast path must either take exactly or leave alone."""
    def q(rid: int, method: str, payload: Any = None, **kw: Any) -> Request:
        raw = kw.pop("raw", None)
        return Request(rid, kw.pop("rank", 0), method,
                       raw if raw is not None else codec.encode_value(payload),
                       kw.pop("deadline", 0.0), rid, kw.pop("client", 9), **kw)

    return [
        q(1, "get_load", {"weight": 1.5}),
        q(2, "flush"),
        q(3, "opt"),                              # payload omitted: the default applies
        q(4, "opt", 7),
        q(5, "get_load", {"weight": "heavy"}),   # InvalidPayload
        q(6, "flush", {"x": 1}),                  # takes no payload
        q(7, "nope"),                             # UnknownMethod
        q(8, "flush", rank=3),                    # WrongRank
        q(9, "flush", deadline=999.0),            # expired (clock is 1000)
        q(10, "flush", deadline=1001.0),
        q(11, "boom"),                            # handler error, code kept
        q(12, "unencodable"),                     # ResultNotEncodable
        q(13, "flush", fence=5),
        q(14, "flush", fence=3),                  # Fenced
        q(15, "flush", fence=5),
        q(16, "flush", key="k1"),                 # idempotency key: runs once ...
        q(17, "flush", key="k1"),                 # ... replayed
        q(18, "get_load", raw=msgspec.Raw(b"")),  # empty Raw: decoded as None -> invalid
        q(19, "flush", raw=msgspec.Raw(b"")),     # empty Raw on a no-payload method: runs
        q(2, "flush"),                            # duplicate: dropped
        q(20, "progress"),
        q(21, "flush", trace={"traceparent": "00-1-2-01"}),
    ]


#: request id -> the error type of its reply ("" for a result); id 2's duplicate is dropped
EXPECTED = {1: "", 2: "", 3: "", 4: "", 5: "InvalidPayload", 6: "InvalidPayload",
            7: "UnknownMethod", 8: "WrongRank", 9: "DeadlineExpired", 10: "", 11: "Fails",
            12: "ResultNotEncodable", 13: "", 14: "Fenced", 15: "", 16: "", 17: "",
            18: "MalformedFrame", 19: "MalformedFrame", 20: "", 21: ""}  # empty Raw: no frame


def check(replies: list[Reply], ran: list[Any]) -> None:
    by_id = {r.id: r for r in replies}
    assert len(replies) == len(by_id) == len(EXPECTED)
    assert {i: (r.error.type if r.error else "") for i, r in by_id.items()} == EXPECTED
    assert by_id[1].ok and msgspec.msgpack.decode(by_id[1].result) == 3.0
    assert msgspec.msgpack.decode(by_id[3].result) == 5 and msgspec.msgpack.decode(
        by_id[4].result) == 7
    assert bytes(by_id[20].result) == msgspec.msgpack.encode(True)
    assert by_id[11].error is not None and by_id[11].error.code == 418
    assert bytes(by_id[17].result) == bytes(by_id[16].result)  # replayed, not run again
    assert ran.count(("flush", None)) == 6 and ("get_load", "heavy") not in ran


def run_poll() -> tuple[list[Reply], EngineEndpoint]:
    net = MemoryNetwork()
    ep = EngineEndpoint(net.engine_transport(0), heartbeat_interval=None, clock=lambda: 1000.0,
                        incarnation=1)
    methods(ep)
    client = net.client_transport()
    ep.open()
    for env in requests(net.codec):
        client.send_nowait(0, env)
    while ep.poll():
        pass
    replies = []
    while (ev := client.try_receive()) is not None:
        assert isinstance(ev, Received) and isinstance(ev.envelope, Reply)
        replies.append(ev.envelope)
    assert not ep.running
    return replies, ep


def test_every_kind_of_request_gets_its_one_reply_in_poll_mode() -> None:
    replies, ep = run_poll()
    check(replies, ep.__dict__["ran"])
    assert ep.fence_high == 5 and ep.counters["duplicates"] == 1


def test_one_clock_read_per_request() -> None:
    """The endpoint reads its clock once per request in poll mode (when it is
    received: the deadline check and ``client_last_seen`` share the read)."""
    net = MemoryNetwork()
    reads: list[int] = []

    def clock() -> float:
        reads.append(1)
        return 1000.0

    ep = EngineEndpoint(net.engine_transport(0), heartbeat_interval=None, clock=clock)
    methods(ep)
    client = net.client_transport()
    ep.open()
    for i in range(1, 5):
        client.send_nowait(0, Request(i, 0, "flush", net.codec.encode_value(None), 2000.0,
                                      i, 9))
    client.send_nowait(0, Request(5, 0, "flush", net.codec.encode_value(None), 999.0, 5, 9))
    reads.clear()
    assert ep.poll() == 5
    assert ep.__dict__["ran"] == [("flush", None)] * 4  # the late one expired, not run
    assert ep.counters["expired"] == 1 and ep.core.client_last_seen == 1000.0
    # one read each, when received: the deadline check and client_last_seen share it
    assert len(reads) == 5



async def _serve_and_collect(ep: EngineEndpoint, net: MemoryNetwork,
                             envs: list[Request], expect: int) -> list[Reply]:
    client = net.client_transport()
    replies: list[Reply] = []
    async with anyio.create_task_group() as tg:
        await tg.start(ep.serve)
        for env in envs:
            client.send_nowait(0, env)
        with anyio.fail_after(10):
            while len(replies) < expect:
                ev = await client.receive()
                if isinstance(ev, Received) and isinstance(ev.envelope, Reply):
                    replies.append(ev.envelope)
        tg.cancel_scope.cancel()
    return replies



async def test_serve_gives_every_kind_of_request_the_same_reply_as_poll() -> None:
    net = MemoryNetwork()
    ep = EngineEndpoint(net.engine_transport(0), heartbeat_interval=None,
                        clock=lambda: 1000.0, incarnation=1)
    methods(ep)
    replies = await _serve_and_collect(ep, net, requests(net.codec), len(EXPECTED))
    check(replies, ep.__dict__["ran"])
    polled, _ = run_poll()
    assert sorted(replies, key=lambda r: r.id) == sorted(polled, key=lambda r: r.id)


async def test_serve_refuses_what_a_full_lane_cannot_take_and_runs_a_sync_request_at_once(
        ) -> None:
    """slow1 runs (the lane's only worker), slow2 fills the lane's buffer
    (``mailbox_size=1``): slow3 is refused ``Busy`` at once (it never runs), and
    ``quick``, arriving after it, runs at once instead of waiting behind it.
    Once the gate opens slow1 and slow2 finish, in order: every request got its
    one reply."""
    net = MemoryNetwork()
    ep = EngineEndpoint(net.engine_transport(0), heartbeat_interval=None, mailbox_size=1)
    order: list[str] = []
    gate = anyio.Event()

    @ep.method()
    async def slow(x: int) -> int:
        order.append(f"slow{x}")
        await gate.wait()
        return x

    @ep.method()
    def quick() -> str:
        order.append("quick")
        return "q"

    codec = net.codec
    client = net.client_transport()
    replies: dict[int, Reply] = {}

    async def read(n: int) -> None:
        with anyio.fail_after(10):
            while len(replies) < n:
                ev = await client.receive()
                if isinstance(ev, Received) and isinstance(ev.envelope, Reply):
                    replies[ev.envelope.id] = ev.envelope

    async with anyio.create_task_group() as tg:
        await tg.start(ep.serve)
        for i in (1, 2, 3):
            client.send_nowait(0, Request(i, 0, "slow", codec.encode_value(i), 0.0, i, 9))
            await anyio.wait_all_tasks_blocked()
        client.send_nowait(0, Request(4, 0, "quick", codec.encode_value(None), 0.0, 4, 9))
        await read(2)  # slow3's refusal and quick's result, while slow1 still runs
        assert order == ["slow1", "quick"]
        busy = replies[3]
        assert not busy.ok and busy.error is not None
        assert (busy.error.type, busy.error.code) == ("Busy", 429)
        assert replies[4].ok
        gate.set()
        await read(4)
        tg.cancel_scope.cancel()
    assert order == ["slow1", "quick", "slow2"]
    assert replies[1].ok and replies[2].ok
    assert ep.counters["busy"] == 1 and ep.queued_requests.held == 0


# -- the reply hot path on ZMQ engine transports ----------------------------------------


def _zmq_run(hot: bool, serve: bool, address: str
             ) -> tuple[list[list[bytes]], dict[str, int], list[int]]:
    """One request stream (every kind, and a reply too large for the codec) through
    an endpoint on a ZMQ DEALER engine transport, its replies encoded by the codec's
    shortcut encoder (``hot``) or by its ``encode``; the raw reply frames the
    client's ROUTER got, the counters, and the ids of the replies sent by
    ``send_nowait`` (envelopes) rather than ``send_encoded_nowait`` (bytes)."""
    from ctlwire.transports.codec import MsgpackCodec
    from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.bind(address)
    codec = MsgpackCodec(max_message_size=4096)
    transport = ZmqDealerEngineTransport(address, 0, codec=codec, context=ctx)
    ep = EngineEndpoint(transport, heartbeat_interval=None, beacon=False,
                        clock=lambda: 1000.0, incarnation=1)
    methods(ep)

    @ep.method()
    def big(n: int) -> bytes:
        return b"x" * n

    if not hot:
        ep.outbox._fast_encode = None
    plain: list[int] = []
    send_nowait = transport.send_nowait

    def counting(route: Any, envelope: Any) -> None:
        if isinstance(envelope, Reply):
            plain.append(envelope.id)
        send_nowait(route, envelope)

    transport.send_nowait = counting  # type: ignore[method-assign]
    envs = [*requests(codec), Request(30, 0, "big", codec.encode_value(5000), 0.0, 30, 9),
            Request(31, 0, "big", codec.encode_value(10), 0.0, 31, 9)]
    expect = len(envs) - 1  # one duplicate
    frames: list[list[bytes]] = []

    def feed() -> None:
        for env in envs:
            router.send_multipart([b"rank-0", codec.encode(env)])

    def collect() -> None:
        while router.poll(0):
            msg = router.recv_multipart()
            if isinstance(codec.decode(msg[1]), Reply):  # not a heartbeat
                frames.append(msg)

    try:
        if serve:
            async def main() -> None:
                async with anyio.create_task_group() as tg:
                    await tg.start(ep.serve)
                    feed()
                    with anyio.fail_after(10):
                        while len(frames) < expect:
                            collect()
                            await anyio.sleep(0.001)
                    tg.cancel_scope.cancel()

            anyio.run(main)
        else:
            ep.open()
            feed()
            deadline = 1000
            while len(frames) < expect and deadline:
                ep.poll()
                collect()
                transport.wait_readable(0.01)
                deadline -= 1
            ep.close()
    finally:
        router.close(0)
        ctx.term()
    return frames, dict(ep.counters), plain


@pytest.mark.parametrize("serve", [False, True], ids=["poll", "serve"])
def test_zmq_reply_hot_path_sends_the_same_bytes(serve: bool) -> None:
    """On a ZMQ engine transport replies go out as bytes encoded by the endpoint
    (``send_encoded_nowait``): the codec's shortcut encoder gives the same frames
    and counters as its ``encode``, and a reply too large for the codec becomes a
    ``ReplyTooLarge`` error."""
    name = "serve" if serve else "poll"
    hot_frames, hot_counters, hot_plain = _zmq_run(True, serve, f"inproc://hot-{name}")
    frames, counters, plain = _zmq_run(False, serve, f"inproc://plain-{name}")
    key = (lambda f: f[1]) if serve else None  # serve: arrival order across lanes may vary
    assert sorted(hot_frames, key=key) == sorted(frames, key=key)
    assert hot_counters == counters
    assert hot_counters["replies_too_large"] == 1 and hot_counters["replied"] == len(frames)
    assert hot_plain == plain == []  # every reply went out encoded, ReplyTooLarge included
    from ctlwire.transports.codec import MsgpackCodec

    too_large = [MsgpackCodec().decode(f[1]) for f in hot_frames]
    assert any(isinstance(r, Reply) and r.id == 30 and r.error is not None
               and r.error.type == "ReplyTooLarge" for r in too_large)
