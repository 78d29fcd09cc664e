"""What metrics and spans say follows what the ranks answered: a fan-out whose every
rank raised is FAILED, one with some ranks failed or left out PARTIAL, each such
rank an event on the client span; engine spans carry method, rank and outcome; an
invalid W3C trace context is counted and the request still served."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from ctlwire.kernel import EngineEndpoint, EngineHarness, OperationRunner, RequestMetrics
from ctlwire.kernel.observability.otel import ClientTracing, traced
from ctlwire.kernel.observability.tracing import trace_contexts, traceparent_valid

pytestmark = pytest.mark.anyio

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def _setup(tracer: Any) -> Any:
    def setup(endpoint: EngineEndpoint) -> None:
        rank = endpoint.rank

        @endpoint.method()
        @traced(tracer=tracer)
        def load() -> int:
            return rank

        @endpoint.method()
        @traced(tracer=tracer)
        def broken() -> None:
            raise OSError(f"disk gone on rank {rank}")

        @endpoint.method()
        @traced(tracer=tracer)
        def flaky() -> int:
            if rank == 1:
                raise OSError("only rank 1 fails")
            return rank

    return setup


def _call(spans: tuple[ReadableSpan, ...], method: str) -> ReadableSpan:
    (span,) = [s for s in spans if s.name == f"ctlwire.call {method}"]
    return span


async def test_metric_outcome_and_span_follow_the_ranks(
        provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    tracer = provider.get_tracer("test")
    metrics = RequestMetrics()
    async with EngineHarness(3, _setup(tracer), observer=metrics) as h:
        tracing = ClientTracing(tracer).install(h.client)
        c = h.client
        assert (await c.fan_out("load", timeout=10)).ok
        everyone = await c.fan_out("broken", timeout=10)
        assert set(everyone.errors) == {0, 1, 2} and not everyone.results
        some = await c.fan_out("flaky", timeout=10)
        assert set(some.errors) == {1} and set(some.results) == {0, 2}
        OperationRunner(c).quarantine(2, detail="held for the test")
        skipped = await c.fan_out("load", mode="concurrent", timeout=10)
        assert skipped.left_out == {2: "quarantined"} and not skipped.ok
        only = await c.fan_out("load", ranks="admissible", mode="concurrent", timeout=10)
        assert only.ok and only.left_out == {2: "quarantined"}
        assert tracing.open_spans == 0

    assert metrics.outcomes == {("load", "DONE"): 2, ("broken", "FAILED"): 1,
                                ("flaky", "PARTIAL"): 1, ("load", "PARTIAL"): 1}
    spans = exporter.get_finished_spans()
    calls = [s for s in spans if s.name.startswith("ctlwire.call ")]
    by_outcome = {(s.name, s.attributes["ctlwire.outcome"], s.status.status_code)
                  for s in calls if s.attributes is not None}
    assert by_outcome == {("ctlwire.call load", "DONE", StatusCode.UNSET),
                          ("ctlwire.call broken", "FAILED", StatusCode.ERROR),
                          ("ctlwire.call flaky", "PARTIAL", StatusCode.ERROR),
                          ("ctlwire.call load", "PARTIAL", StatusCode.ERROR)}
    broken = _call(spans, "broken")
    failed = sorted((e.attributes["ctlwire.rank"], e.attributes["exception.type"],
                     e.attributes["exception.message"])
                    for e in broken.events if e.name == "rank failed" and e.attributes)
    assert failed == [(r, "OSError", f"disk gone on rank {r}") for r in range(3)]
    assert broken.status.description == "failed: 3 of 3 ranks failed"
    flaky = _call(spans, "flaky")
    assert [(e.name, e.attributes and e.attributes["ctlwire.rank"]) for e in flaky.events] == [
        ("rank failed", 1)]
    (left,) = [s for s in calls if s.attributes and s.attributes["ctlwire.outcome"] == "PARTIAL"
               and s.name == "ctlwire.call load"]
    assert [(e.name, dict(e.attributes or {})) for e in left.events] == [
        ("rank left out", {"ctlwire.rank": 2, "ctlwire.reason": "quarantined"})]
    assert left.status.description == "partial: 0 of 2 ranks failed, 1 left out"


async def test_engine_spans_carry_method_rank_and_outcome(
        provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    tracer = provider.get_tracer("test")
    async with EngineHarness(2, _setup(tracer)) as h:
        ClientTracing(tracer).install(h.client)
        await h.client.fan_out("flaky", timeout=10)
    handles = [s for s in exporter.get_finished_spans() if s.name == "ctlwire.handle flaky"]
    seen = sorted((s.attributes["ctlwire.rank"], s.attributes["ctlwire.method"],
                   s.attributes["ctlwire.outcome"], s.status.status_code)
                  for s in handles if s.attributes is not None)
    assert seen == [(0, "flaky", "ok", StatusCode.UNSET), (1, "flaky", "error", StatusCode.ERROR)]
    assert all(isinstance(s.attributes["ctlwire.request_id"], int)
               for s in handles if s.attributes is not None)


@pytest.mark.parametrize("value", [
    "garbage",
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero parent id
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",  # uppercase hex
    VALID + "-extra",                                           # version 00 is 55 long
    "",
])
def test_invalid_traceparents_are_refused(value: str) -> None:
    assert not traceparent_valid(value)


def test_valid_traceparents_pass() -> None:
    assert traceparent_valid(VALID)
    assert traceparent_valid("01" + VALID[2:] + "-a-later-version-may-extend-it")


async def test_an_invalid_trace_context_is_counted_and_served_as_a_new_root(
        provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    tracer = provider.get_tracer("test")
    carriers = iter([{"traceparent": "garbage"},
                     {"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"},
                     {"traceparent": "ff" + VALID[2:]},
                     {"traceparent": VALID.upper()},
                     {"traceparent": VALID}])
    async with EngineHarness(1, _setup(tracer)) as h:
        before = (await h.client.engine_metrics(0))["trace_contexts"]
        h.client.trace_provider = lambda: next(carriers)
        for _ in range(5):
            assert await h.client.call("load", timeout=10) == 0  # served, every one
        h.client.trace_provider = None
        after = (await h.client.engine_metrics(0))["trace_contexts"]
    assert after["invalid"] - before["invalid"] == 4
    assert after["continued"] - before["continued"] == 1
    handles = [s for s in exporter.get_finished_spans() if s.name == "ctlwire.handle load"]
    invalid = [s for s in handles
               if s.attributes and s.attributes.get("ctlwire.trace_context") == "invalid"]
    assert len(invalid) == 4 and all(s.parent is None for s in invalid)  # new roots
    (continued,) = [s for s in handles if s.parent is not None]
    assert continued.context.trace_id == int(VALID.split("-")[1], 16)


async def test_the_trace_context_counts_are_the_process_s() -> None:
    before = trace_contexts.snapshot()
    assert trace_contexts.check(None) == "absent"
    assert trace_contexts.check({"traceparent": "nope"}) == "invalid"
    assert trace_contexts.check({"traceparent": VALID}) == "continued"
    after = trace_contexts.snapshot()
    assert {k: after[k] - before[k] for k in after} == {
        "continued": 1, "absent": 1, "invalid": 1}
