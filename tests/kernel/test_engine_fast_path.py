"""The engine's per-request fast path.

* The fast path (:meth:`EngineEndpoint._run_fast`) must give exactly what the
  general path gives — same replies, counters, states, fencing, progress — for
  every kind of request: an A/B run of one request stream through an endpoint
  with and without it.
* It must actually be taken for the common case (a valid, fresh request), in
  poll mode and in serve mode.
* Serve mode does the dispatcher's work itself only while nothing is queued at
  the dispatcher, so a request never overtakes an earlier one.
* One clock read per request on the fast path.
* On ZMQ engine transports replies go out as bytes the endpoint encoded
  (``send_encoded_nowait``): the same frames and counters as ``send_nowait``.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import pytest
import zmq

from ctlwire.kernel.engine_endpoint import EngineEndpoint, report_progress
from ctlwire.transports.envelope import ErrorInfo, Reply, Request
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


def run_poll(fast: bool) -> tuple[list[Reply], dict[str, int], dict[Any, int], list[Any], int]:
    net = MemoryNetwork()
    ep = EngineEndpoint(net.engine_transport(0), heartbeat_interval=None, clock=lambda: 1000.0,
                        incarnation=1)
    methods(ep)
    if not fast:
        ep._fast.clear()
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
    return replies, dict(ep.counters), dict(ep.states), ep.__dict__["ran"], ep.fence_high


def test_fast_path_answers_exactly_like_the_general_path() -> None:
    fast, slow = run_poll(True), run_poll(False)
    assert fast == slow
    replies = fast[0]
    assert len(replies) == 21  # one duplicate dropped
    by_id = {r.id: r for r in replies}
    assert by_id[20].ok and bytes(by_id[20].result) == msgspec.msgpack.encode(True)
    assert by_id[11].error is not None and by_id[11].error.code == 418
    assert by_id[14].error is not None and by_id[14].error.type == "Fenced"


def test_one_clock_read_per_request() -> None:
    """The endpoint reads its clock once per request taken on the fast path (when it
    is received: the deadline check and ``client_last_seen`` share the read)."""
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
    assert ep.counters["expired"] == 1 and ep.client_last_seen == 1000.0
    # 4 fresh requests: one read each; the expired one: one when received, and the
    # general path's (its deadline check and its error message)
    assert len(reads) == 4 + 1 + 2


def test_fast_path_is_taken_for_a_valid_fresh_request(monkeypatch: pytest.MonkeyPatch) -> None:
    net = MemoryNetwork()
    ep = EngineEndpoint(net.engine_transport(0), heartbeat_interval=None)
    methods(ep)
    client = net.client_transport()
    ep.open()

    def general(*a: Any) -> Any:
        raise AssertionError("the general path ran for a common-case request")

    monkeypatch.setattr(ep, "_admit", general)
    client.send_nowait(0, Request(1, 0, "get_load", net.codec.encode_value({"weight": 2.0}),
                                  0.0, 1, 9))
    client.send_nowait(0, Request(2, 0, "opt", net.codec.encode_value(None), 0.0, 2, 9))
    assert ep.poll() == 2
    ev1, ev2 = client.try_receive(), client.try_receive()
    assert isinstance(ev1, Received) and isinstance(ev1.envelope, Reply) and ev1.envelope.ok
    assert isinstance(ev2, Received) and isinstance(ev2.envelope, Reply) and ev2.envelope.ok
    assert ep.__dict__["ran"] == [("get_load", 2.0), ("opt", 5)]


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


async def test_serve_fast_path_same_answers_and_taken() -> None:
    async def run(fast: bool) -> tuple[list[Reply], dict[str, int], list[Any]]:
        net = MemoryNetwork()
        ep = EngineEndpoint(net.engine_transport(0), heartbeat_interval=None,
                            clock=lambda: 1000.0, incarnation=1)
        methods(ep)
        taken: list[int] = []
        if not fast:
            ep._fast.clear()
        else:
            run_fast = ep._run_fast

            def spy(req: Request, route: Any, now: float) -> Any:
                reply = run_fast(req, route, now)
                if reply is not None:
                    taken.append(req.id)
                return reply

            ep._run_fast = spy  # type: ignore[method-assign]
        envs = requests(net.codec)
        replies = await _serve_and_collect(ep, net, envs, 21)
        if fast:
            # the first ones find the dispatcher idle; later ones may queue behind a
            # request the general path took (so as not to overtake it)
            assert {1, 2, 3, 4} <= set(taken) <= {1, 2, 3, 4, 10, 11, 12, 13, 15, 20, 21}
        return sorted(replies, key=lambda r: r.id), dict(ep.counters), ep.__dict__["ran"]

    assert await run(True) == await run(False)


async def test_serve_never_overtakes_a_request_queued_at_the_dispatcher() -> None:
    """While an async request waits for room in its (full) lane, the dispatcher is
    busy: a later sync request must wait behind it rather than be run at once."""
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
    replies: list[Reply] = []
    async with anyio.create_task_group() as tg:
        await tg.start(ep.serve)
        # slow1 runs (holds the lane's only worker), slow2 fills the lane's buffer,
        # slow3 makes the dispatcher wait for lane room; quick arrives after slow3.
        for i in (1, 2, 3):
            client.send_nowait(0, Request(i, 0, "slow", codec.encode_value(i), 0.0, i, 9))
            await anyio.wait_all_tasks_blocked()
        client.send_nowait(0, Request(4, 0, "quick", codec.encode_value(None), 0.0, 4, 9))
        await anyio.wait_all_tasks_blocked()
        assert "quick" not in order  # queued behind slow3 at the dispatcher
        gate.set()
        with anyio.fail_after(10):
            while len(replies) < 4:
                ev = await client.receive()
                if isinstance(ev, Received) and isinstance(ev.envelope, Reply):
                    replies.append(ev.envelope)
        tg.cancel_scope.cancel()
    assert order.index("quick") > order.index("slow2")
    assert all(r.ok for r in replies)


def test_codec_shortcuts_agree_with_the_codec() -> None:
    from ctlwire.transports.codec import JsonCodec, MsgpackCodec, PickleCodec

    for codec in (MsgpackCodec(), JsonCodec()):
        pair_ = codec.fast_value_codec(Load)
        assert pair_ is not None
        encode, decode = pair_
        raw = codec.encode_value(Load(2.5))
        assert encode(Load(2.5)) == bytes(raw)
        assert decode(raw) == codec.decode_value(raw, Load)
        dec = codec.fast_envelope_decoder()
        assert dec is not None
        env = Request(1, 0, "m", raw)
        assert dec(codec.encode(env)) == codec.decode(codec.encode(env))
    pickled = PickleCodec(allow_pickle=True)
    assert pickled.fast_value_codec(Load) is None  # payloads pickled: no shortcut
    assert pickled.fast_envelope_decoder() is not None
    reply = Reply(3, 0, 7, False, MsgpackCodec().encode_value(None), ErrorInfo("E", "m", 1))
    for codec in (MsgpackCodec(), JsonCodec(), pickled):
        enc = codec.fast_envelope_encoder()
        assert enc is not None
        for env in (Request(1, 0, "m", codec.encode_value(Load(2.5)), 5.0, key="k"), reply):
            assert enc(env) == codec.encode(env)

    class Framed(MsgpackCodec):  # a codec whose envelope encoding differs: no shortcut
        def encode(self, envelope: Any) -> bytes:
            return b"!" + super().encode(envelope)

    assert Framed().fast_envelope_encoder() is None



async def test_router_client_caches_are_bounded_and_batched_sends_deliver() -> None:
    from ctlwire.transports import zmq_client
    from ctlwire.transports.envelope import Heartbeat
    from ctlwire.transports.zmq_client import ZmqRouterClientTransport

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    transport = ZmqRouterClientTransport("inproc://fast-client", context=ctx)
    engines = []
    try:
        async with transport:
            for rank in range(3):
                raw = ctx.socket(zmq.DEALER)
                raw.setsockopt(zmq.IDENTITY, b"rank-%d" % rank)
                raw.connect("inproc://fast-client")
                raw.send(transport.codec.encode(Heartbeat(rank, 1)))
                engines.append(raw)
            seen = set()
            with anyio.fail_after(10):
                while len(seen) < 3:
                    ev = await transport.receive()
                    assert isinstance(ev, Received)
                    seen.add(ev.peer)
            codec = transport.codec
            with transport.batched_sends():
                for rank in range(3):
                    transport.send_nowait(rank, Request(rank + 1, rank, "m",
                                                        codec.encode_value(None)))
            for rank, raw in enumerate(engines):
                assert raw.poll(5000)
                env = codec.decode(raw.recv())
                assert isinstance(env, Request) and env.id == rank + 1
            # a peer choosing many identities cannot grow the caches without bound
            data = codec.encode(Heartbeat(0, 1))
            for i in range(zmq_client._CACHE_LIMIT + 100):
                ev = transport._event([b"rank-%d" % (1000 + i), data])
                assert isinstance(ev, Received) and ev.peer == 1000 + i
            assert len(transport._rank_of) <= zmq_client._CACHE_LIMIT
            # a cached identity still decodes, and a junk frame from it is still Dropped
            ev = transport._event([b"rank-1", b"\xc1junk"])
            assert not isinstance(ev, Received) and ev.reason == "malformed"  # type: ignore[union-attr]
    finally:
        for raw in engines:
            raw.close(0)
        ctx.term()


# -- the reply hot path on ZMQ engine transports ----------------------------------------


def _zmq_run(hot: bool, serve: bool, address: str
             ) -> tuple[list[list[bytes]], dict[str, int], list[int]]:
    """One request stream (every kind, and a reply too large for the codec) through
    an endpoint on a ZMQ DEALER engine transport; the raw reply frames the client's
    ROUTER got, the counters, and the ids of the replies sent by ``send_nowait``
    (envelopes) rather than ``send_encoded_nowait`` (bytes)."""
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
        ep._encode_envelope = None
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
    (``send_encoded_nowait``): the same frames and counters as through
    ``send_nowait``, and a reply too large for the codec still becomes a
    ``ReplyTooLarge`` error (through the general path)."""
    name = "serve" if serve else "poll"
    hot_frames, hot_counters, hot_plain = _zmq_run(True, serve, f"inproc://hot-{name}")
    frames, counters, plain = _zmq_run(False, serve, f"inproc://plain-{name}")
    key = (lambda f: f[1]) if serve else None  # serve: arrival order across lanes may vary
    assert sorted(hot_frames, key=key) == sorted(frames, key=key)
    assert hot_counters == counters
    assert hot_counters["replies_too_large"] == 1 and hot_counters["replied"] == len(frames)
    assert hot_plain == [30]  # only the reply that did not fit took send_nowait
    assert sorted(plain) == sorted(set(plain)) and len(plain) == len(frames)
    from ctlwire.transports.codec import MsgpackCodec

    too_large = [MsgpackCodec().decode(f[1]) for f in hot_frames]
    assert any(isinstance(r, Reply) and r.id == 30 and r.error is not None
               and r.error.type == "ReplyTooLarge" for r in too_large)

