"""The application layer: the ``ctlwire`` command line and the tools it runs.

* :mod:`~ctlwire.app.cli` -- ``ctlwire diagrams | demo | bench | keys``;
* :mod:`~ctlwire.app.demo` with its simulated engines
  (:mod:`~ctlwire.app.demo_engine`, :mod:`~ctlwire.app.operation_engine`);
* :mod:`~ctlwire.app.engine_process` (``python -m ctlwire.app.engine_process``)
  and :mod:`~ctlwire.app.engine_fleet`, which starts such processes;
* :mod:`~ctlwire.app.diagram_files`, writing the state diagrams to a folder;
* the torch extra: :mod:`~ctlwire.app.torch_engine` (a real engine, a torch
  model served by a poll loop), :mod:`~ctlwire.app.torch_weight_sync` (its
  trainer, weights moved by gloo broadcast in one operation per sync) and
  :mod:`~ctlwire.app.torch_demo` (``ctlwire demo --torch``).

Nothing here is imported by the rest of the kernel; ``EngineFleet``,
``EngineProcess`` and ``EngineStartError`` are re-exported from
:mod:`ctlwire.kernel`. This package imports none of its modules (so
``python -m ctlwire.app.engine_process`` runs its module once).
"""
