"""An endpoint's inbound decisions in memory: fences move only for validated,
state-changing requests (on the fast path and the general one alike), read-only
methods ignore fences and keys, idempotency keys are bounded and scoped, and a
heartbeat that reaches every peer names no request."""

from __future__ import annotations

import time
from typing import Any

import anyio
import msgspec
import pytest

from ctlwire.kernel.core.result_cache import ResultCache
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.errors import Fenced, RemoteError, RequestTimedOut
from ctlwire.testing import EngineHarness
from ctlwire.transports.envelope import Reply, Request
from ctlwire.transports.memory import MemoryEngineTransport, MemoryNetwork
from ctlwire.transports.transport import Received

pytestmark = pytest.mark.anyio

FAR = 2**64 - 1


class _Inbox(MemoryEngineTransport):
    """A memory engine transport whose received events are handed in as they are
    (any route), through :attr:`inbox`."""

    def __init__(self, network: MemoryNetwork) -> None:
        super().__init__(network, 0)
        self.inbox: list[Any] = []

    def try_receive(self) -> Any:
        return self.inbox.pop(0) if self.inbox else None


def setup(ep: EngineEndpoint) -> None:
    ran = ep.__dict__.setdefault("ran", [])

    @ep.method()
    def apply(n: int) -> int:  # sync inline: the fast path takes it
        ran.append(("apply", n))
        return n

    @ep.method()
    async def apply_async(n: int) -> int:  # the general path
        ran.append(("apply_async", n))
        return n

    @ep.method(read_only=True)
    def status() -> int:
        ran.append(("status", 0))
        return len(ran)

    @ep.method()
    async def hang() -> None:
        await anyio.sleep_forever()


class Pump:
    """A poll()-mode endpoint driven by a raw in-memory client transport."""

    def __init__(self, **kw: Any) -> None:
        self.net = MemoryNetwork()
        self.ep = EngineEndpoint(self.net.engine_transport(0), heartbeat_interval=None, **kw)
        setup(self.ep)
        self.client = self.net.client_transport()
        self.ep.open()
        self.next_id = 0

    def call(self, method: str, payload: Any = None, **fields: Any) -> Reply:
        self.next_id += 1
        codec = self.net.codec
        raw = codec.encode_value(payload) if not isinstance(payload, msgspec.Raw) else payload
        self.client.send_nowait(0, Request(self.next_id, 0, method, raw, **fields))
        self.ep.poll()
        while True:
            ev = self.client.try_receive()
            assert ev is not None, "no reply"
            if isinstance(ev, Received) and isinstance(ev.envelope, Reply):
                return ev.envelope


def error(reply: Reply) -> str:
    assert not reply.ok and reply.error is not None, reply
    return reply.error.type


@pytest.mark.parametrize("method", ["apply", "apply_async"])
async def test_poll_moves_the_fence_only_for_a_valid_state_changing_request(method: str) -> None:
    """The fast path (apply) and the general path (apply_async, refused in poll
    mode after admission) decide alike."""
    p = Pump()
    assert error(p.call(method, "not an int", fence=500)) == "InvalidPayload"
    assert p.ep.fence_high == 0
    assert error(p.call(method, 1, fence=FAR)) == "FenceOutOfRange"
    assert error(p.call(method, 1, fence=-3)) == "FenceOutOfRange"
    assert p.call("status", fence=FAR).ok and p.call("status", fence=900).ok
    assert p.ep.fence_high == 0
    p.call(method, 1, fence=500)
    assert p.ep.fence_high == 500
    assert error(p.call(method, 2, fence=499)) == "Fenced"
    assert p.call("status", fence=1).ok  # read-only: not fenced either
    assert p.ep.counters["fence_out_of_range"] == 2 and p.ep.counters["fenced"] == 1


async def test_the_fence_window_is_configurable_and_reported() -> None:
    p = Pump(fence_window=10.0)
    now_us = int(time.time() * 1_000_000)
    assert error(p.call("apply", 1, fence=now_us + 60_000_000)) == "FenceOutOfRange"
    assert p.call("apply", 1, fence=now_us + 1_000_000).ok
    assert p.ep.metrics()["fence_window"] == 10.0


async def test_serve_moves_the_fence_only_for_a_valid_state_changing_request() -> None:
    async with EngineHarness(ranks=1, setup=setup) as h:
        c, ep = h.client, h.engines[0]
        for method in ("apply", "apply_async"):
            with pytest.raises(RemoteError) as info:
                await c.call(method, "not an int", fence=FAR)
            assert info.value.type_name == "FenceOutOfRange" and info.value.code == 416
            with pytest.raises(RemoteError) as info:
                await c.call(method, "not an int", fence=700)
            assert info.value.type_name == "InvalidPayload"
        assert await c.call("status", fence=FAR) >= 0
        assert await c.call("ctlwire.metrics", fence=FAR) and ep.fence_high == 0
        assert await c.call("apply_async", 1, fence=700) == 1
        assert await c.call("apply", 2, fence=800) == 2
        assert ep.fence_high == 800
        with pytest.raises(Fenced):
            await c.call("apply_async", 3, fence=700)


async def test_a_read_only_method_ignores_keys() -> None:
    p = Pump()
    first, second = p.call("status", key="k"), p.call("status", key="k")
    assert first.ok and second.ok and first.result != second.result  # it ran twice
    assert len(p.ep.results) == 0 and p.ep.counters["idempotent_replays"] == 0


async def test_two_methods_with_the_same_key_both_run_and_repeats_replay() -> None:
    async with EngineHarness(ranks=1, setup=setup) as h:
        c = h.client
        assert await c.call("apply", 1, idempotency_key="k") == 1
        assert await c.call("apply_async", 2, idempotency_key="k") == 2
        assert await c.call("apply_async", 3, idempotency_key="k") == 2  # replayed
        assert h.engines[0].__dict__["ran"] == [("apply", 1), ("apply_async", 2)]
        assert h.engines[0].counters["idempotent_replays"] == 1


async def test_a_keyed_run_cancelled_without_an_outcome_forgets_its_key() -> None:
    async with EngineHarness(ranks=1, setup=setup) as h:
        ep = h.engines[0]
        with pytest.raises(RequestTimedOut):
            await h.client.call("hang", idempotency_key="k", timeout=0.5)
        assert len(ep.results) == 1  # running
        h.stop_engine(0)
        with anyio.fail_after(5):
            while ep.running:
                await anyio.sleep(0.01)
        assert len(ep.results) == 0 and ep.results.bytes == 0
        assert ep.results.lookup(("client", h.client.registry.incarnation), "hang", "k") is None


async def test_an_async_handler_refused_by_poll_leaves_no_key_behind() -> None:
    p = Pump()
    assert error(p.call("apply_async", 1, key="k")) == "AsyncHandlerInPoll"
    assert len(p.ep.results) == 0 and p.ep.results.bytes == 0


async def test_long_keys_and_a_full_cache_are_refused_without_running() -> None:
    p = Pump(result_cache=ResultCache(max_entries=2, max_key_bytes=16, retention=3600.0,
                                      owner_share=1.0))
    assert error(p.call("apply", 1, key="k" * 17)) == "KeyTooLong"
    assert p.call("apply", 1, key="a").ok and p.call("apply", 2, key="b").ok
    refused = p.call("apply", 3, key="c")
    assert error(refused) == "CacheFull" and refused.error is not None
    assert refused.error.code == 507
    assert p.call("apply", 1, key="a").ok  # still recorded: replayed
    assert p.ep.__dict__["ran"] == [("apply", 1), ("apply", 2)]
    assert p.ep.counters["idempotency_key_too_long"] == 1
    assert p.ep.counters["idempotency_cache_full"] == 1
    assert p.ep.metrics()["idempotency_cache"]["refused_full"] == 1


def test_a_heartbeat_every_peer_sees_names_no_request() -> None:
    net = MemoryNetwork()
    ep = EngineEndpoint(net.engine_transport(0), heartbeat_interval=None)
    ep.running[(7 << 32) | 3] = ("update", time.monotonic())
    ep.report_progress((7 << 32) | 3, 0.5, "half")
    private = ep.status_heartbeat()
    assert private is not None and private.busy == (7 << 32) | 3 and private.note == "half"
    ep.liveness.shared_heartbeats = True
    shared = ep.status_heartbeat()
    assert shared is not None and shared.method == "update"
    assert shared.busy == 0 and shared.progress < 0 and shared.note == ""


def test_keys_are_scoped_by_the_connection_and_without_routes_by_the_client_field() -> None:
    """A key is its route's own, whatever ``client`` a request names; a transport
    without routes serves one client, which the ``client`` field names."""
    ran = {}
    for scope, routes in (("routes", (b"a", b"b")), ("no routes", (None, None))):
        net = MemoryNetwork()
        transport = _Inbox(net)
        ep = EngineEndpoint(transport, heartbeat_interval=None)
        setup(ep)
        ep.open()
        for n, client, route in ((1, 5, routes[0]), (2, 6, routes[0]), (3, 5, routes[1])):
            req = Request(n, 0, "apply", net.codec.encode_value(n), client=client, key="k")
            transport.inbox.append(Received(req, route=route))
            assert ep.poll() == 1
        ran[scope] = [n for _, n in ep.__dict__["ran"]]
    assert ran == {"routes": [1, 3], "no routes": [1, 2]}
