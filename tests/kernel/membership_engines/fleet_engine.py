"""Engine methods for the membership tests: the operation engine's (weight version,
pause, operations) plus the diagnostic ones (mark, marks, sleep) and a step that
can be told to block the engine's thread (``block_next_step``)."""

from __future__ import annotations

from collections.abc import Callable

from ctlwire.kernel.app import operation_engine
from ctlwire.kernel.app.engine_process import stepping_methods
from ctlwire.kernel.engine.endpoint import EngineEndpoint


def register(ep: EngineEndpoint) -> Callable[[], bool]:
    operation_step = operation_engine.register(ep)
    blocking_step = stepping_methods(ep)

    def step() -> bool:
        ran = blocking_step()
        return operation_step() or ran

    return step
