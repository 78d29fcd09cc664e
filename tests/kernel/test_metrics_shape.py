"""One metrics shape for client and engine; the engine's metrics read from the
client through the built-in ``ctlwire.metrics`` method; Prometheus."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import pytest

from ctlwire.kernel import EngineEndpoint, EngineHarness, PrometheusExporter, RemoteError
from ctlwire.kernel.observability.metrics import (
    ENGINE_METRICS_METHOD,
    EnginePrometheusExporter,
    client_metrics,
    engine_metrics,
    snapshot,
)
from ctlwire.transports import MemoryNetwork

pytestmark = [pytest.mark.anyio, pytest.mark.ctlwire_virtual_clock]

SHARED = {"role", "live_requests", "outcomes", "frames_dropped", "counters"}


def methods(ep: EngineEndpoint) -> None:
    @ep.method()
    def echo(value: Any = None) -> Any:
        return value

    @ep.method()
    async def hang() -> None:
        await anyio.sleep(1000)


async def test_client_and_engine_share_one_shape(ctlwire_harness: Any) -> None:
    async with ctlwire_harness(ranks=2, setup=methods) as h:
        await h.client.call("echo", 1, rank=1)
        c = h.client.metrics()
        e = await h.client.engine_metrics(1)
    assert set(c) >= SHARED and set(e) >= SHARED
    assert (c["role"], e["role"], e["rank"]) == ("client", "engine", 1)
    snap = snapshot(h.client)  # the same dict, plus what was read from the engines
    assert snap["engines"] == {1: e} and set(c) < set(snap)
    assert c["outcomes"] == {"DONE": 1} and snap["outcomes"] == {"DONE": 2}
    assert e["outcomes"] == {"REPLIED": 1} and e["counters"]["received"] >= 1
    assert e["methods"] == ["echo", "hang"]  # the built-in one is not the engine's own
    # one name for each number: no alias of an earlier shape, no counter at the top
    assert not {"registry", "mailboxes", "states"} & (set(c) | set(e))
    assert not set(c["counters"]) & set(c) and not set(e["counters"]) & set(e)


async def test_engine_metrics_come_through_the_allow_listed_builtin(ctlwire_harness: Any
                                                                    ) -> None:
    async with ctlwire_harness(ranks=1, setup=methods) as h:
        ep = h.engines[0]
        assert ep.builtin_methods == [ENGINE_METRICS_METHOD]
        with pytest.raises(ValueError, match="already registered"):
            ep.register(ENGINE_METRICS_METHOD, lambda: {"fake": 1})
        async with anyio.create_task_group() as tg:
            tg.start_soon(h.client.call, "hang", None)
            await anyio.wait_all_tasks_blocked()
            remote = await h.client.engine_metrics(0)  # answered while hang runs
            tg.cancel_scope.cancel()
        # what runs now: the hung handler, and the metrics request itself
        assert sorted(remote["running"].values()) == [ENGINE_METRICS_METHOD, "hang"]
        assert remote["live_requests"] == 2
        assert h.client.last_engine_metrics[0] == remote
        # read-only: a payload is refused; getattr dispatch does not exist
        with pytest.raises(RemoteError, match="InvalidPayload"):
            await h.client.call(ENGINE_METRICS_METHOD, {"x": 1})
        with pytest.raises(RemoteError, match="UnknownMethod"):
            await h.client.call("metrics")


def test_engine_metrics_are_msgpack_able() -> None:
    ep = EngineEndpoint(MemoryNetwork().engine_transport(0))
    ep.running[7] = ("update_weights", 0.0)
    m = engine_metrics(ep)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(m))["running"] == {7: "update_weights"}
    assert m == ep.metrics() | {"running": {7: "update_weights"}}


async def test_prometheus_exports_client_and_engine_metrics(ctlwire_harness: Any) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    async with ctlwire_harness(ranks=2, setup=methods) as h:
        await h.client.call("echo", 1, rank=0)
        for rank in (0, 1):
            await h.client.engine_metrics(rank)
        registry = CollectorRegistry()
        PrometheusExporter(h.client).register(registry)
        text = generate_latest(registry).decode()
        engine_registry = CollectorRegistry()
        EnginePrometheusExporter(h.engines[1]).register(engine_registry)
        engine_text = generate_latest(engine_registry).decode()
    assert 'ctlwire_engine_events_total{counter="replied",rank="0"}' in text
    assert 'ctlwire_engine_live_requests{rank="1"} 1.0' in text  # the read itself
    assert 'ctlwire_frames_dropped_total{reason="malformed"} 0.0' in text
    assert 'ctlwire_engine_events_total{counter="received",rank="1"}' in engine_text
    assert client_metrics(h.client)["live_requests"] == 0


async def test_harness_metrics_through_an_explicit_harness() -> None:
    async with EngineHarness(ranks=1, setup=methods) as h:
        assert (await h.client.engine_metrics(0))["incarnation"] == h.engines[0].incarnation
