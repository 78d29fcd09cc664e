"""OpenTelemetry spans (ctlwire.kernel.observability.otel): a span per control request and per
operation step on the client, continued on the engine from the W3C trace
context the envelope carries -- in one process, and across engine processes
(one operation on 3 engines: one trace)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode

from ctlwire.kernel import (
    ControlClient,
    EngineEndpoint,
    EngineFleet,
    OperationPlan,
    OperationRunner,
    OperationStep,
    RequestTimedOut,
    StepCall,
)
from ctlwire.kernel.observability.otel import ClientTracing, traced
from ctlwire.kernel.observability.tracing import current_trace
from ctlwire.testing import EngineHarness
from ctlwire.transports import ZmqRouterClientTransport

ENGINES = Path(__file__).resolve().parent / "otel_engines"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def _by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


@pytest.mark.anyio
async def test_a_call_is_one_trace_from_client_to_engine(
        provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    tracer = provider.get_tracer("test")
    carried: list[dict[str, str] | None] = []

    def setup(endpoint: EngineEndpoint) -> None:
        @endpoint.method()
        @traced(tracer=tracer)
        def ping(value: int) -> int:
            carried.append(current_trace.get())
            return value

        @endpoint.method()
        @traced(tracer=tracer)
        async def hang() -> None:
            await anyio.sleep(3600)

    async with EngineHarness(2, setup) as h:
        tracing = ClientTracing(tracer).install(h.client)
        with tracer.start_as_current_span("api request") as root:
            assert await h.client.call("ping", 7, rank=1) == 7
            with pytest.raises(RequestTimedOut):
                await h.client.call("hang", rank=0, timeout=0.2)
        assert tracing.open_spans == 0

    spans = exporter.get_finished_spans()
    (call,) = _by_name(spans, "ctlwire.call ping")
    (handle,) = _by_name(spans, "ctlwire.handle ping")
    trace_id = root.get_span_context().trace_id
    assert call.kind is SpanKind.CLIENT and handle.kind is SpanKind.SERVER
    assert call.context.trace_id == handle.context.trace_id == trace_id
    assert call.parent is not None and call.parent.span_id == root.get_span_context().span_id
    assert handle.parent is not None and handle.parent.span_id == call.context.span_id
    assert call.attributes is not None and call.attributes["ctlwire.outcome"] == "DONE"
    assert carried and carried[0] is not None and "traceparent" in carried[0]
    (timed_out,) = _by_name(spans, "ctlwire.call hang")
    assert timed_out.status.status_code is StatusCode.ERROR
    assert timed_out.attributes is not None
    assert timed_out.attributes["ctlwire.outcome"] == "TIMED_OUT"


@pytest.mark.anyio
async def test_without_tracing_the_envelope_carries_no_trace() -> None:
    carried: list[dict[str, str] | None] = []

    def setup(endpoint: EngineEndpoint) -> None:
        @endpoint.method()
        def ping() -> None:
            carried.append(current_trace.get())

    async with EngineHarness(1, setup) as h:
        await h.client.call("ping")
        assert h.client.trace_provider is None
    assert carried == [None]


def _plan(version: int, old: int) -> OperationPlan:
    return OperationPlan("weight-update", (
        OperationStep("pause", "pause", timeout=10, compensation=StepCall("resume")),
        OperationStep("update", "update_weights", version, timeout=10,
                      compensation=StepCall("restore_weights", old)),
        OperationStep("resume", "resume", timeout=10),
    ))


@pytest.mark.anyio
async def test_one_operation_on_three_engine_processes_is_one_trace(
        provider: TracerProvider, exporter: InMemorySpanExporter, tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    address = f"ipc://{tmp_path}/control.sock"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ENGINES), os.environ.get("PYTHONPATH")) if p)}
    tracer = provider.get_tracer("test")
    with EngineFleet(3, lambda r: ["--connect", address, "--methods",
                                   "traced_engine:register"], env=env):
        async with ControlClient(ZmqRouterClientTransport(address), ranks=3,
                                 default_timeout=20.0) as client:
            await client.wait_ready(timeout=30)
            tracing = ClientTracing(tracer).install(client)
            runner = OperationRunner(client)
            with tracing.operation("weight-update") as on_progress:
                result = await runner.run(_plan(1, 0), on_progress=on_progress)
            assert result.state.name == "COMMITTED"
            client.trace_provider = None  # reading the engines' spans is not traced
            client.registry.observers.remove(tracing.observe)
            engine_spans: dict[int, list[dict[str, Any]]] = {
                rank: await client.call("finished_spans", rank=rank) for rank in range(3)}
            await client.aclose()

    spans = exporter.get_finished_spans()
    (op,) = _by_name(spans, "ctlwire.operation weight-update")
    trace_id = f"{op.context.trace_id:032x}"
    steps = {s.name: s for s in spans if s.name.startswith("ctlwire.step ")}
    assert set(steps) == {"ctlwire.step pause", "ctlwire.step update", "ctlwire.step resume"}
    calls = _by_name(spans, "ctlwire.call ctlwire.step")
    assert len(calls) == 3  # one control request per step, to all three ranks
    call_ids = set()
    for call in calls:
        assert call.parent is not None
        assert call.parent.span_id in {s.context.span_id for s in steps.values()}
        call_ids.add(f"{call.context.span_id:016x}")
    for step in steps.values():
        assert step.parent is not None and step.parent.span_id == op.context.span_id
    every_trace = {f"{s.context.trace_id:032x}" for s in spans}
    for rank, handled in engine_spans.items():
        names = sorted(s["name"] for s in handled)
        assert names == ["ctlwire.handle pause", "ctlwire.handle resume",
                         "ctlwire.handle update_weights"], (rank, handled)
        for s in handled:
            assert s["kind"] == "SERVER" and s["parent_id"] in call_ids, (rank, s)
            every_trace.add(s["trace_id"])
    assert every_trace == {trace_id}  # one operation, four processes: one trace
