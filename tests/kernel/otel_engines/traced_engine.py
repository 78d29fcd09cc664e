"""An engine rank whose handlers are traced with OpenTelemetry: each engine
process keeps its finished spans in the SDK's in-memory exporter and serves
them back through ``finished_spans``, so a test can put one trace together
across processes. (``--methods traced_engine:register``, this folder on
``PYTHONPATH``.)"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ctlwire.kernel import EngineEndpoint, OperationLedger
from ctlwire.kernel.observability.otel import traced

EXPORTER = InMemorySpanExporter()


def _spans() -> list[dict[str, Any]]:
    out = []
    for span in EXPORTER.get_finished_spans():
        ctx = span.get_span_context()
        assert ctx is not None
        out.append({"name": span.name, "trace_id": f"{ctx.trace_id:032x}",
                    "span_id": f"{ctx.span_id:016x}",
                    "parent_id": f"{span.parent.span_id:016x}" if span.parent else "",
                    "kind": span.kind.name})
    return out


def register(endpoint: EngineEndpoint) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)
    state = {"version": 0, "paused": False}

    def pause() -> None:
        state["paused"] = True

    def resume() -> None:
        state["paused"] = False

    def update_weights(version: int) -> int:
        state["version"] = version
        return version

    def restore_weights(version: int) -> int:
        state["version"] = version
        return version

    OperationLedger({"pause": traced()(pause), "resume": traced()(resume),
                     "update_weights": traced()(update_weights),
                     "restore_weights": traced()(restore_weights)}).install(endpoint)
    endpoint.register("finished_spans", _spans)
