"""Engine methods for the membership tests: the operation engine's (weight version,
pause, operations) plus the diagnostic ones (mark, marks, sleep) and a step that
can be told to block the engine's thread (``block_next_step`` for some seconds,
``block_next_step_until`` a file exists)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from ctlwire.app import operation_engine
from ctlwire.app.engine_process import stepping_methods
from ctlwire.kernel.engine.endpoint import EngineEndpoint


def register(ep: EngineEndpoint) -> Callable[[], bool]:
    operation_step = operation_engine.register(ep)
    blocking_step = stepping_methods(ep)
    gates: list[str] = []

    @ep.method()
    def block_next_step_until(path: str) -> None:
        """The next step blocks the engine's thread until ``path`` exists (60 s at most)."""
        gates.append(path)

    def step() -> bool:
        ran = blocking_step()
        if gates:
            path, ran = gates.pop(), True
            give_up = time.monotonic() + 60
            while not os.path.exists(path) and time.monotonic() < give_up:
                time.sleep(0.005)
        return operation_step() or ran

    return step
