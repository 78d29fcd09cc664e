"""A simulated engine whose weight update runs as an operation (demo, tests).

::

    python -m ctlwire.app.engine_process \
        --methods ctlwire.app.operation_engine:register

starts a :class:`~ctlwire.app.demo_engine.SimulatedEngine` rank whose
``pause``, ``update_weights``, ``restore_weights`` and ``resume`` also run as
operation steps through an :class:`~ctlwire.kernel.engine.operation_ledger.OperationLedger`,
plus:

* ``arm_fault(Fault)`` -- the next run of ``method`` on this rank raises
  (``"raise"``), kills the process (``"crash"``), blocks for ``seconds``
  (``"hang"``) or returns success without changing anything (``"skip"``, a
  silent failure only a post-condition catches): fault injection for tests
  and ``ctlwire demo --fault``.
* ``op_counts()`` -- how many times each step method really ran here, and the
  ledger's counters (applied, replayed, fenced, highest fence): what the tests
  count to prove nothing was applied twice.

``register_async`` serves the same engine with ``async def`` weight steps
(``update_weights`` and ``restore_weights`` await before they change anything),
``register_threaded`` with every step in a worker thread, so the engine
answers other methods while a long step runs; both need ``--mode serve``.

:func:`weight_update_plan` is the pause -> update_weights -> resume operation
for this engine, with its compensations.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import anyio
import msgspec

from ctlwire.app.demo_engine import Pause, SimulatedEngine, UpdateWeights
from ctlwire.kernel.core.operation_plan import (
    OperationPlan,
    OperationStep,
    PostCondition,
    StepCall,
)
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.engine.operation_ledger import OperationLedger
from ctlwire.kernel.errors import CtlwireError

__all__ = ["Fault", "OperationEngine", "RestoreWeights", "register", "register_async",
           "register_threaded", "weight_update_plan"]


class Fault(msgspec.Struct, frozen=True):
    method: str
    kind: str = "raise"  # raise | crash | hang | skip
    seconds: float = 0.0


class RestoreWeights(msgspec.Struct, frozen=True):
    version: int


class InjectedFault(CtlwireError, RuntimeError):
    code = 500


class OperationEngine(SimulatedEngine):
    """SimulatedEngine plus restore_weights and fault injection."""

    def __init__(self, rank: int) -> None:
        super().__init__(rank)
        self.faults: dict[str, Fault] = {}

    def arm_fault(self, fault: Fault) -> None:
        self.faults[fault.method] = fault

    def _maybe_fail(self, method: str) -> bool:
        """Apply an armed fault of ``method``; True when the call must change nothing."""
        fault = self.faults.pop(method, None)
        if fault is None:
            return False
        if fault.kind == "crash":
            os._exit(9)
        if fault.kind == "hang":
            time.sleep(fault.seconds)
            return False
        if fault.kind == "skip":
            return True
        raise InjectedFault(f"rank {self.rank}: injected failure in {method}")

    def op_pause(self, req: Pause = Pause()) -> dict[str, Any]:  # noqa: B008 - frozen struct
        self._maybe_fail("pause")
        return self.pause(req)

    def op_update_weights(self, req: UpdateWeights) -> dict[str, Any]:
        if self._maybe_fail("update_weights"):
            return {"rank": self.rank, "version": req.version}  # claims it, did nothing
        return self.update_weights(req)

    def restore_weights(self, req: RestoreWeights) -> dict[str, Any]:
        self._maybe_fail("restore_weights")
        self.version = req.version
        return {"rank": self.rank, "version": self.version}

    def op_resume(self) -> dict[str, Any]:
        self._maybe_fail("resume")
        return self.resume()

    async def async_update_weights(self, req: UpdateWeights) -> dict[str, Any]:
        """update_weights after awaiting the transfer (an async weight load)."""
        await anyio.sleep(0.01 + req.load_seconds)
        self._maybe_fail("update_weights")
        return self.update_weights(UpdateWeights(req.version, req.path))

    async def async_restore_weights(self, req: RestoreWeights) -> dict[str, Any]:
        await anyio.sleep(0.01)
        return self.restore_weights(req)


def weight_update_plan(version: int, old_version: int, *, timeout: float = 10.0,
                       quarantine_on_error: bool = False,
                       load_seconds: float = 0.0) -> OperationPlan:
    """pause -> update_weights(version) -> resume; undo: pause, restore old_version, resume;
    before commit every rank must report ``version`` and not paused.
    ``load_seconds``: how long each rank's update blocks (reporting progress)."""
    return OperationPlan("weight-update", (
        OperationStep("pause", "pause", Pause("drain"), timeout,
                      compensation=StepCall("resume")),
        OperationStep("update", "update_weights", UpdateWeights(version, "", load_seconds),
                      max(timeout, 3 * load_seconds),
                      compensation=StepCall("restore_weights", RestoreWeights(old_version)),
                      quarantine_on_error=quarantine_on_error),
        # once a rank serves again, undoing the operation starts by pausing it, so
        # old weights are never restored under traffic
        OperationStep("resume", "resume", None, timeout, compensation=StepCall("pause")),
    ), PostCondition("get_server_info", {"version": version, "paused": False}, timeout=timeout))


def register(ep: EngineEndpoint) -> Callable[[], bool]:
    """Register the engine's methods and its operation ledger on ``ep``; returns its step."""
    return _register(ep, "sync")


def register_async(ep: EngineEndpoint) -> Callable[[], bool]:
    """As :func:`register`, with ``async def`` update and restore steps (``--mode serve``)."""
    return _register(ep, "async")


def register_threaded(ep: EngineEndpoint) -> Callable[[], bool]:
    """As :func:`register`, every step in a worker thread (``--mode serve``)."""
    return _register(ep, "threaded")


def _register(ep: EngineEndpoint, steps: str) -> Callable[[], bool]:
    engine = OperationEngine(ep.rank)
    handlers: dict[str, Callable[..., Any]] = {
        "pause": engine.op_pause, "update_weights": engine.op_update_weights,
        "restore_weights": engine.restore_weights, "resume": engine.op_resume}
    if steps == "async":
        handlers["update_weights"] = engine.async_update_weights
        handlers["restore_weights"] = engine.async_restore_weights
    ledger = OperationLedger(handlers, threaded=steps == "threaded")
    ledger.install(ep)
    ep.register("pause", engine.pause)
    ep.register("update_weights", engine.update_weights)
    ep.register("resume", engine.resume)
    ep.register("get_server_info", engine.get_server_info)
    ep.register("get_load", engine.get_load)
    ep.register("arm_fault", engine.arm_fault)

    @ep.method()
    def op_counts() -> dict[str, Any]:
        return {"runs": dict(ledger.runs), **ledger.metrics()}

    return engine.step
