"""Engines that step like an inference scheduler, for both sides of a comparison.

A scheduler's loop runs a device step, during which its CPU waits, and between
steps serves every control request that has arrived (SGLang's scheduler:
receive all pending requests, process them, run the next forward step). Both
fleets here step the same way: sleep :data:`STEP_SECONDS`, then answer every
request waiting, without blocking.

* ctlwire's engine is ``python -m ctlwire.app.engine_process --mode poll`` with
  :func:`stepping_echo` as its methods: the poll loop calls the step, then
  :meth:`~ctlwire.kernel.engine.endpoint.EngineEndpoint.poll`, which answers up
  to 64 ready requests without blocking (more than a fan-out pipeline keeps at
  one rank), so every request waiting is answered at each step.
* The peer's is the bare pyzmq engine with ``--step``
  (:func:`~ctlwire.benchmarks.baseline_engine.serve`): non-blocking
  receives until none is left.

Both answer ``echo`` and ``steps`` (the steps taken so far).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.app.engine_process import diagnostic_methods
from ctlwire.kernel.engine.endpoint import EngineEndpoint

from .fleets import ModuleFleet

__all__ = ["STEP_SECONDS", "ctlwire_fleet", "peer_fleet", "stepping_echo"]

STEP_SECONDS = 0.002
"""One step of every stepping engine: the time its CPU waits for the device."""


def stepping_echo(ep: EngineEndpoint) -> Callable[[], bool]:
    """The diagnostic methods (``echo`` among them) and ``steps``; returns the step:
    sleep :data:`STEP_SECONDS` and count it (it always did work: the loop never idles)."""
    diagnostic_methods(ep)
    taken = [0]

    @ep.method()
    def steps() -> int:
        return taken[0]

    def step() -> bool:
        time.sleep(STEP_SECONDS)
        taken[0] += 1
        return True

    return step


def ctlwire_fleet(address: str, ranks: int) -> EngineFleet:
    """``ranks`` ctlwire engines in poll mode, stepping, dialling ``address``."""
    return EngineFleet(ranks, lambda rank: [
        "--connect", address, "--mode", "poll",
        "--methods", "ctlwire.benchmarks.stepping_engines:stepping_echo"])


def peer_fleet(address: str, ranks: int) -> EngineFleet:
    """``ranks`` bare pyzmq engines, stepping, dialling ``address``."""
    return ModuleFleet("ctlwire.benchmarks.baseline_engine", ranks,
                       lambda rank: ["--connect", address, "--step", str(STEP_SECONDS)])
