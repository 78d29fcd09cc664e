"""Coordinated multi-step operations over a client: the anyio shell of
:mod:`ctlwire.kernel.core.operation_core`.

* :mod:`.runner` -- :class:`~ctlwire.kernel.operations.runner.OperationRunner`, the public
  API: run a plan over the ranks, quarantine and release, read what each rank applied.
* :mod:`.step_dispatch` -- one step sent to its ranks, retried while safe, aborted on loss.
* :mod:`.step_outcomes` -- each rank's answer to a step, typed.
* :mod:`.ledger_reads` -- the ranks' operation ledgers read back (last operation, take-over).
* :mod:`.recovery` -- what remains of an operation a controller left undecided, read
  from the ranks' ledgers.

The engine side (each rank's ledger of steps) is
:mod:`ctlwire.kernel.engine.operation_ledger`. Names are imported from
:mod:`ctlwire.kernel` (``from ctlwire.kernel import OperationRunner``).
"""
