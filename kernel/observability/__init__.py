"""What the kernel tells an operator: metrics, transition logs and traces.

* :mod:`.metrics` -- the one metrics shape of a client, an engine and a runner; the
  Prometheus exporters (the ``prometheus`` extra); the transition log.
* :mod:`.tracing` -- W3C trace context carried in the envelopes; the
  :class:`~ctlwire.kernel.observability.tracing.TraceProvider` seam.
* :mod:`.otel` -- OpenTelemetry spans through that seam (the ``tracing`` extra).

Names are imported from :mod:`ctlwire.kernel` (``from ctlwire.kernel import
RequestMetrics``).
"""
