"""Trace context carried in the envelope, for OpenTelemetry or any tracer.

The client asks an optional ``trace_provider`` for a ``dict[str, str]`` carrier
(e.g. filled by ``opentelemetry.propagate.inject``) when it sends a request;
the carrier travels as the envelope's opaque ``trace`` field; on the engine,
:data:`current_trace` holds it while the handler runs, ready for
``opentelemetry.propagate.extract(current_trace.get() or {})``. ctlwire never
interprets it on the way: a tracer that reads it (:func:`ctlwire.kernel.observability.otel.traced`)
checks its W3C ``traceparent`` with :func:`traceparent_valid` and counts what it
found in :data:`trace_contexts` (per process, shown in every engine's metrics).
:mod:`ctlwire.kernel.observability.otel` does all of this with OpenTelemetry (the ``tracing``
extra).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from contextvars import ContextVar

__all__ = ["TraceContexts", "TraceProvider", "current_trace", "trace_contexts",
           "traceparent_valid"]

TraceProvider = Callable[[], dict[str, str] | None]

current_trace: ContextVar[dict[str, str] | None] = ContextVar("ctlwire_trace", default=None)
"""The trace carrier of the request whose handler is running (engine side)."""

# version-traceid-parentid-flags, lowercase hex; a later version may append "-..."
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?",
                          re.DOTALL)


def traceparent_valid(value: str) -> bool:
    """Whether ``value`` is a valid W3C ``traceparent``: lowercase hex fields,
    version not ``ff`` (version ``00`` exactly 55 characters), and neither an
    all-zero trace id nor an all-zero parent id."""
    m = _TRACEPARENT.fullmatch(value) if type(value) is str else None
    if m is None:
        return False
    version, trace_id, parent_id, _, rest = m.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return False
    return trace_id != "0" * 32 and parent_id != "0" * 16


class TraceContexts:
    """Counts, per process, the trace contexts handlers read: ``continued`` (a
    valid ``traceparent``), ``absent`` (none: a new root) and ``invalid`` (one
    that is not valid W3C: served as a new root, its carrier ignored)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # handlers run on worker threads too
        self.counts: dict[str, int] = {"continued": 0, "absent": 0, "invalid": 0}

    def check(self, carrier: Mapping[str, str] | None) -> str:
        """Classify ``carrier``'s ``traceparent`` (``continued``, ``absent`` or
        ``invalid``), count it and return the verdict."""
        value = carrier.get("traceparent") if carrier else None
        verdict = ("absent" if value is None
                   else "continued" if traceparent_valid(value) else "invalid")
        with self._lock:
            self.counts[verdict] += 1
        return verdict

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


trace_contexts = TraceContexts()
"""This process's :class:`TraceContexts` (what ``traced`` handlers counted)."""
