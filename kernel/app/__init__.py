"""The application layer: the ``ctlwire`` command line and the tools it runs.

* :mod:`~ctlwire.kernel.app.cli` -- ``ctlwire diagrams | demo | bench | keys``;
* :mod:`~ctlwire.kernel.app.demo` with its simulated engines
  (:mod:`~ctlwire.kernel.app.demo_engine`, :mod:`~ctlwire.kernel.app.operation_engine`);
* :mod:`~ctlwire.kernel.app.engine_process` (``python -m ctlwire.kernel.app.engine_process``)
  and :mod:`~ctlwire.kernel.app.engine_fleet`, which starts such processes;
* :mod:`~ctlwire.kernel.app.diagram_files`, writing the state diagrams to a folder.

Nothing here is imported by the rest of the kernel; ``EngineFleet``,
``EngineProcess`` and ``EngineStartError`` are re-exported from
:mod:`ctlwire.kernel`. This package imports none of its modules (so
``python -m ctlwire.kernel.app.engine_process`` runs its module once).
"""
