"""EngineEndpoint: allow-list, validation, deadlines, dedup, bad frames, poll() and serve()."""

from __future__ import annotations

import time
from typing import Any

import anyio
import msgspec
import pytest

from ctlwire.kernel.engine.endpoint import EngineEndpoint, ErrorCode
from ctlwire.kernel.errors import RemoteError
from ctlwire.states import InboundState
from ctlwire.testing import EngineHarness, virtual_backend
from ctlwire.transports.envelope import Reply, Request
from ctlwire.transports.memory import MemoryNetwork
from ctlwire.transports.transport import Received

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return virtual_backend(request.param)


class Load(msgspec.Struct):
    weight: float
    tags: list[str] = []


def methods(ep: EngineEndpoint) -> None:
    ran = ep.__dict__.setdefault("ran", [])

    @ep.method()
    def get_load(q: Load) -> float:
        ran.append(("get_load", q.weight))
        return q.weight * 2

    @ep.method("flush_cache")
    def flush() -> str:
        ran.append(("flush_cache", None))
        return "flushed"

    @ep.method()
    async def async_ping(x: int = 1) -> int:
        await anyio.sleep(0)
        return x

    @ep.method(threaded=True)
    def blocking_io(x: int) -> int:
        time.sleep(0.001)
        return x + 1


def request(codec: Any, rid: int, method: str, payload: Any, *, rank: int = 0,
            deadline: float = 0.0, client: int = 9) -> Request:
    return Request(rid, rank, method, codec.encode_value(payload), deadline, rid, client)


class Pump:
    """Drives a poll()-mode endpoint against a raw in-memory client transport."""

    def __init__(self, ep: EngineEndpoint, net: MemoryNetwork) -> None:
        self.ep, self.net = ep, net
        self.client = net.client_transport()

    def send(self, env: Request) -> None:
        self.client.send_nowait(0, env)

    def replies(self) -> list[Reply]:
        out = []
        while True:
            ev = self.client.try_receive()
            if ev is None:
                return out
            if isinstance(ev, Received) and isinstance(ev.envelope, Reply):
                out.append(ev.envelope)


def make_pump(**kw: Any) -> Pump:
    net = MemoryNetwork()
    ep = EngineEndpoint(net.engine_transport(0), heartbeat_interval=None, **kw)
    methods(ep)
    pump = Pump(ep, net)
    ep.open()
    return pump


async def test_poll_runs_registered_methods_in_arrival_order() -> None:
    p = make_pump()
    codec = p.net.codec
    p.send(request(codec, 1, "get_load", {"weight": 1.5}))
    p.send(request(codec, 2, "flush_cache", None))
    p.send(request(codec, 3, "get_load", {"weight": 2.0, "tags": ["a"]}))
    assert p.ep.poll() == 3
    replies = p.replies()
    assert [r.id for r in replies] == [1, 2, 3]
    assert [codec.decode_value(r.result) for r in replies] == [3.0, "flushed", 4.0]
    assert p.ep.__dict__["ran"] == [("get_load", 1.5), ("flush_cache", None), ("get_load", 2.0)]
    assert p.ep.poll() == 0  # nothing left, never blocks
    assert p.ep.states[InboundState.REPLIED] == 3


async def test_unknown_method_and_bad_payload_are_rejected_not_run() -> None:
    p = make_pump()
    codec = p.net.codec
    p.send(request(codec, 1, "__class__", None))
    p.send(request(codec, 2, "get_load", {"weight": "heavy"}))
    p.send(request(codec, 3, "get_load", [1, 2, 3]))
    p.send(request(codec, 4, "flush_cache", {"unexpected": True}))
    p.ep.poll()
    replies = p.replies()
    assert [(r.ok, r.error.type if r.error else None) for r in replies] == [
        (False, "UnknownMethod"), (False, "InvalidPayload"), (False, "InvalidPayload"),
        (False, "InvalidPayload")]
    assert replies[0].error is not None and replies[0].error.code == ErrorCode.UNKNOWN_METHOD
    assert p.ep.__dict__["ran"] == []
    assert p.ep.states[InboundState.REJECTED] == 4
    assert p.ep.counters["rejected"] == 4


async def test_expired_request_is_not_run() -> None:
    p = make_pump(clock=lambda: 1000.0)
    codec = p.net.codec
    p.send(request(codec, 1, "flush_cache", None, deadline=999.0))
    p.send(request(codec, 2, "flush_cache", None, deadline=1001.0))
    p.ep.poll()
    r1, r2 = p.replies()
    assert r1.error is not None and r1.error.type == "DeadlineExpired"
    assert r1.error.code == ErrorCode.DEADLINE_EXPIRED
    assert r2.ok
    assert p.ep.__dict__["ran"] == [("flush_cache", None)]
    assert p.ep.states[InboundState.EXPIRED] == 1


async def test_duplicate_request_runs_at_most_once() -> None:
    p = make_pump()
    codec = p.net.codec
    env = request(codec, 7, "flush_cache", None)
    p.send(env)
    p.send(env)
    # the same id on the same route is a duplicate whatever client id it claims
    p.send(request(codec, 7, "flush_cache", None, client=10))
    p.send(request(codec, 8, "flush_cache", None))
    p.ep.poll()
    assert len(p.replies()) == 2
    assert p.ep.counters["duplicates"] == 2
    assert len(p.ep.__dict__["ran"]) == 2


async def test_malformed_frames_are_answered_or_counted_and_serving_continues() -> None:
    p = make_pump()
    codec = p.net.codec
    p.net.inject_to_engine(0, b"\xc1\xc1")  # undecodable: no id to answer
    salvageable = msgspec.msgpack.encode(["q", 77, 0, "flush_cache", None, "soon", 0, 0, None])
    p.net.inject_to_engine(0, salvageable)  # id readable, deadline of the wrong type
    p.net.inject_to_engine(0, codec.encode(Reply(5, 0, 1, True, codec.encode_value(None))))
    p.send(request(codec, 8, "flush_cache", None))
    p.ep.poll()
    replies = p.replies()
    assert [(r.id, r.ok) for r in replies] == [(77, False), (8, True)]
    assert replies[0].error is not None and replies[0].error.type == "MalformedFrame"
    assert p.ep.counters["dropped_malformed"] == 2
    assert p.ep.counters["dropped_wrong_type"] == 1


async def test_oversized_frame_is_dropped() -> None:
    from ctlwire.transports.codec import MsgpackCodec

    net = MemoryNetwork(MsgpackCodec(max_message_size=256))
    ep = EngineEndpoint(net.engine_transport(0), heartbeat_interval=None)
    methods(ep)
    client = net.client_transport()
    ep.open()
    net.inject_to_engine(0, b"\x00" * 1000)
    client.send_nowait(0, request(net.codec, 1, "flush_cache", None))
    ep.poll()
    assert ep.counters["dropped_oversized"] == 1
    ev = client.try_receive()
    assert isinstance(ev, Received) and isinstance(ev.envelope, Reply) and ev.envelope.ok


async def test_wrong_rank_is_rejected() -> None:
    p = make_pump()
    p.send(request(p.net.codec, 1, "flush_cache", None, rank=3))
    p.ep.poll()
    (r,) = p.replies()
    assert r.error is not None and r.error.type == "WrongRank"


async def test_async_handler_in_poll_mode_gets_an_error_reply() -> None:
    p = make_pump()
    p.send(request(p.net.codec, 1, "async_ping", 5))
    p.ep.poll()
    (r,) = p.replies()
    assert not r.ok and r.error is not None
    assert r.error.code == ErrorCode.ASYNC_HANDLER_IN_POLL


async def test_registration_is_an_allow_list() -> None:
    net = MemoryNetwork()
    ep = EngineEndpoint(net.engine_transport(0))
    with pytest.raises(TypeError):
        ep.register("two", lambda a, b: None)
    ep.register("one", lambda: 1)
    with pytest.raises(ValueError):
        ep.register("one", lambda: 2)
    assert ep.methods == ["one"]


async def test_serve_runs_async_threaded_and_sync_handlers() -> None:
    async with EngineHarness(ranks=1, setup=methods) as h:
        c = h.client
        assert await c.call("async_ping", 41) == 41
        assert await c.call("async_ping") == 1  # the handler's default applies
        assert await c.call("get_load", Load(0.25)) == 0.5
        with pytest.raises(RemoteError):
            await c.call("get_load")
        assert h.engines[0].counters["heartbeats_sent"] >= 1


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])  # real time: a worker thread
async def test_threaded_handler_runs_in_a_worker_thread() -> None:
    async with EngineHarness(ranks=1, setup=methods) as h:
        assert await h.client.call("blocking_io", 1, timeout=10.0) == 2


async def test_sync_engine_in_a_poll_loop_task() -> None:
    """An engine embedded in a synchronous step loop, polled between steps."""
    net = MemoryNetwork()
    ep = EngineEndpoint(net.engine_transport(0))
    steps = [0]

    @ep.method()
    def get_steps() -> int:
        return steps[0]

    from ctlwire.kernel.client.control_client import ControlClient

    async with ControlClient(net.client_transport(), ranks=1) as client:
        async with anyio.create_task_group() as tg:
            ep.open()

            async def engine_loop() -> None:
                while True:
                    steps[0] += 1  # "generate"
                    ep.poll()
                    await anyio.sleep(0.01)

            tg.start_soon(engine_loop)
            await client.wait_ready(timeout=1.0)
            first = await client.call("get_steps")
            await anyio.sleep(0.5)
            second = await client.call("get_steps")
            assert second > first > 0
            tg.cancel_scope.cancel()
        ep.close()


def test_incarnations_minted_in_one_process_only_grow() -> None:
    """An endpoint restarted within the same millisecond must not look older
    than the one it replaces (its heartbeats would be fenced as stale)."""
    from ctlwire.kernel.engine.liveness import new_incarnation

    minted = [new_incarnation() for _ in range(2_000)]
    assert minted == sorted(set(minted))  # strictly increasing
