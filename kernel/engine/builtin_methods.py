"""Names of the control methods every :class:`~ctlwire.kernel.engine.endpoint.EngineEndpoint`
serves built in (read-only, allow-listed like any registered method).

A module of its own, importing nothing, so that the client (which calls these
methods) and the endpoint (which serves them) share the names without either
importing the other or :mod:`ctlwire.kernel.observability.metrics`.
"""

from __future__ import annotations

__all__ = ["BUILTIN_METHODS", "ENGINE_METRICS_METHOD"]

ENGINE_METRICS_METHOD = "ctlwire.metrics"
"""The engine's metrics (:meth:`EngineEndpoint.metrics`, the engine side of the one
metrics shape); ``await client.engine_metrics(rank)`` calls it."""

BUILTIN_METHODS: frozenset[str] = frozenset({ENGINE_METRICS_METHOD})
"""Every built-in method name (an application cannot register these)."""
