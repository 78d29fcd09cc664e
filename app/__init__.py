"""The application layer: the ``ctlwire`` command line and the tools it runs.

* :mod:`~ctlwire.kernel.app.cli` -- ``ctlwire diagrams | demo | bench | keys``;
* :mod:`~ctlwire.kernel.app.demo` with its simulated engines
  (:mod:`~ctlwire.kernel.app.demo_engine`, :mod:`~ctlwire.kernel.app.operation_engine`);
* :mod:`~ctlwire.kernel.app.engine_process` (``python -m ctlwire.kernel.app.engine_process``)
  and :mod:`~ctlwire.kernel.app.engine_fleet`, which starts such processes;
* :mod:`~ctlwire.kernel.app.diagram_files`, writing the state diagrams to a folder;
* the torch extra: :mod:`~ctlwire.kernel.app.torch_engine` (a real engine, a torch
  model served by a poll loop), :mod:`~ctlwire.kernel.app.torch_weight_sync` (its
  trainer, weights moved by gloo broadcast in one operation per sync) and
  :mod:`~ctlwire.kernel.app.torch_demo` (``ctlwire demo --torch``).

Nothing here is imported by the rest of the kernel; ``EngineFleet``,
``EngineProcess`` and ``EngineStartError`` are re-exported from
:mod:`ctlwire.kernel`. This package imports none of its modules (so
``python -m ctlwire.kernel.app.engine_process`` runs its module once).
"""
