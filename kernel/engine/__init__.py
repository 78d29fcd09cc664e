"""The engine side: :class:`~ctlwire.kernel.engine.endpoint.EngineEndpoint` and the
parts it owns, each built and tested alone.

* :mod:`.endpoint` -- the public endpoint: ``poll()``/``run_blocking()`` and ``serve()``.
* :mod:`.method_table` -- the allow-list of control methods and their payload types.
* :mod:`ctlwire.kernel.core.inbound_core` -- every admission decision and
  ``InboundRequest`` transition (sans-IO).
* :mod:`.handler_runner` -- where an admitted request's handler runs.
* :mod:`.outbox` -- replies out, bounded per route and in total.
* :mod:`.liveness` -- what is running, progress and heartbeats.
* :mod:`.serve` -- the event-loop embedding: dispatcher and per-method lanes.
* :mod:`.operation_ledger` -- operations' steps, validated, fenced and recorded.
"""
