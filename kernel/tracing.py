"""Trace context carried in the envelope, for OpenTelemetry or any tracer.

The client asks an optional ``trace_provider`` for a ``dict[str, str]`` carrier
(e.g. filled by ``opentelemetry.propagate.inject``) when it sends a request;
the carrier travels as the envelope's opaque ``trace`` field; on the engine,
:data:`current_trace` holds it while the handler runs, ready for
``opentelemetry.propagate.extract(current_trace.get() or {})``. ctlwire never
looks inside it. :mod:`ctlwire.kernel.otel` does all of this with OpenTelemetry
(the ``tracing`` extra).
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

__all__ = ["TraceProvider", "current_trace"]

TraceProvider = Callable[[], dict[str, str] | None]

current_trace: ContextVar[dict[str, str] | None] = ContextVar("ctlwire_trace", default=None)
"""The trace carrier of the request whose handler is running (engine side)."""
