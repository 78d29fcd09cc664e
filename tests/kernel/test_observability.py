"""Metrics snapshot, latency histograms, structured transition logs, Prometheus, tracing."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.errors import RequestTimedOut
from ctlwire.kernel.observability.metrics import (
    LatencyHistogram,
    PrometheusExporter,
    RequestMetrics,
    TransitionLog,
    snapshot,
)
from ctlwire.kernel.observability.tracing import current_trace
from ctlwire.testing import EngineHarness, virtual_backend

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return virtual_backend(request.param)


def methods(ep: EngineEndpoint) -> None:
    ep.register("echo", lambda x=None: x)
    ep.register("trace", lambda: current_trace.get())

    async def hang() -> None:
        import anyio

        await anyio.sleep_forever()

    ep.register("hang", hang)


def test_histogram_buckets_are_cumulative() -> None:
    h = LatencyHistogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 2.0):
        h.observe(v)
    assert h.cumulative() == [(0.1, 2), (1.0, 3), (float("inf"), 4)]
    assert h.count == 4 and h.total == pytest.approx(2.65)
    assert h.quantile(0.5) == 0.1 and h.quantile(0.75) == 1.0


async def test_snapshot_counts_outcomes_latency_and_peers(caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    metrics = RequestMetrics()
    async with EngineHarness(ranks=2, setup=methods, observer=None) as h:
        c = h.client
        c.registry.observers += [metrics, TransitionLog()]
        with caplog.at_level(logging.DEBUG, logger="ctlwire.transitions"):
            for i in range(5):
                await c.call("echo", i)
            await c.fan_out("echo", "x")
            with pytest.raises(RequestTimedOut):
                await c.call("hang", timeout=1.0)
        snap = snapshot(c)
        assert snap["live_requests"] == 0 and snap["tombstones"] == 7
        # rank 0 still runs the hung handler the caller gave up on: alive and busy
        assert snap["peers"] == {0: "BUSY", 1: "CONNECTED"}
        assert c.rank_status(0)["method"] == "hang" and c.rank_status(1)["method"] == ""
        assert snap["outcomes"] == {"DONE": 6, "TIMED_OUT": 1}
        assert snap["transitions"]["TIMED_OUT--clean"] == 1
        req = snap["requests"]
        assert req["latency"]["echo"]["count"] == 6
        assert req["outcomes"] == {"echo:DONE": 6, "hang:TIMED_OUT": 1}
        assert snap["replies_dropped"]["late"] == 0
        assert snap["mailbox_depth"] == {"echo": 0}
        records = [r for r in caplog.records if r.name == "ctlwire.transitions"]
        # 6 requests x 4 transitions (send, wait, complete, clean) + the timeout's 4
        assert len(records) == 7 * 4
        last = records[-1]
        assert (last.method, last.old, last.event, last.new) == (  # type: ignore[attr-defined]
            "hang", "TIMED_OUT", "clean", "CLEANED")
        assert isinstance(last.request_id, int)  # type: ignore[attr-defined]


async def test_prometheus_exporter_exposes_the_snapshot() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    metrics = RequestMetrics()
    async with EngineHarness(ranks=1, setup=methods, observer=None) as h:
        h.client.registry.observers.append(metrics)
        await h.client.call("echo", 1)
        registry = CollectorRegistry()
        PrometheusExporter(h.client, metrics).register(registry)
        text = generate_latest(registry).decode()
    assert "ctlwire_live_requests 0.0" in text
    assert 'ctlwire_requests_total{method="echo",outcome="DONE"} 1.0' in text
    assert 'ctlwire_request_seconds_count{method="echo"} 1.0' in text
    assert 'ctlwire_peer_state{rank="0",state="CONNECTED"} 1.0' in text
    assert 'ctlwire_transitions_total{transition="DONE--clean"} 1.0' in text


async def test_trace_context_travels_to_the_handler() -> None:
    carrier = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    async with EngineHarness(ranks=1, setup=methods,
                             client_kwargs={"trace_provider": lambda: carrier}) as h:
        assert await h.client.call("trace") == carrier
    async with EngineHarness(ranks=1, setup=methods) as h:
        assert await h.client.call("trace") is None
