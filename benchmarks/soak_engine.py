"""Engine methods for the soak, load and reliability runs (loaded in engine processes).

``--methods ctlwire.benchmarks.soak_engine:methods``: the diagnostic methods
(echo, sleep, nap, hang, pid, metrics, crash, fail) plus ``gate(path)``, an
async handler that returns once ``path`` exists, and ``gated_echo((path, i))``,
which returns ``i`` once ``path`` exists. An engine runs each async method
serially in arrival order (other methods run concurrently), so a gated engine
queues every ``gated_echo`` behind the first: that is how the load run holds
thousands of requests in flight at once, deterministically.
"""

from __future__ import annotations

import os

import anyio

from ctlwire.app.engine_process import diagnostic_methods
from ctlwire.kernel.engine.endpoint import EngineEndpoint

__all__ = ["METHODS", "methods"]

METHODS = "ctlwire.benchmarks.soak_engine:methods"


def methods(ep: EngineEndpoint) -> None:
    """Register the diagnostic methods and ``gate`` on ``ep``."""
    diagnostic_methods(ep)

    @ep.method()
    async def gate(path: str) -> bool:
        while not os.path.exists(path):
            await anyio.sleep(0.005)
        return True

    @ep.method()
    async def gated_echo(args: tuple[str, int]) -> int:
        path, value = args
        while not os.path.exists(path):
            await anyio.sleep(0.005)
        return value
