"""A small simulated inference engine for ``ctlwire demo``.

Each rank runs a step loop that "generates" tokens, keeps a weights version
and a paused flag, and exposes its control methods through an
:class:`~ctlwire.kernel.engine.endpoint.EngineEndpoint` allow-list:

* ``pause(Pause)`` — stop stepping (``mode``: ``"drain"`` or ``"abort"``).
* ``update_weights(UpdateWeights)`` — only while paused; otherwise the caller
  gets ``RemoteError("WeightsUpdateRejected", ..., code=409)``.
* ``resume()`` — start stepping again.
* ``get_server_info()`` — rank, version, paused, steps, tokens, and the
  per-rank sequence number of this very call (to verify FIFO order).
* ``get_load()`` — a cheap load report, for watching-mode callers.

Used by ``python -m ctlwire.app.engine_process --methods
ctlwire.app.demo_engine:register``; ``register`` returns the step function.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import msgspec

from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.errors import CtlwireError

__all__ = ["Pause", "SimulatedEngine", "UpdateWeights", "WeightsUpdateRejected", "register"]


class Pause(msgspec.Struct, frozen=True):
    mode: str = "drain"


class UpdateWeights(msgspec.Struct, frozen=True):
    version: int
    path: str = ""
    load_seconds: float = 0.0  # a real load blocks the engine's thread this long


class WeightsUpdateRejected(CtlwireError, RuntimeError):
    code = 409


class SimulatedEngine:
    """The engine's state; ``step`` is one iteration of its generation loop."""

    def __init__(self, rank: int, step_seconds: float = 0.002) -> None:
        self.rank = rank
        self.version = 0
        self.paused = False
        self.steps = 0
        self.tokens = 0
        self.info_calls = 0
        self.step_seconds = step_seconds
        self._rng = random.Random(rank)

    def step(self) -> bool:
        """Generate for one step; False (nothing done) while paused."""
        if self.paused:
            return False
        time.sleep(self.step_seconds)
        self.steps += 1
        self.tokens += self._rng.randint(8, 64)
        return True

    def pause(self, req: Pause = Pause()) -> dict[str, Any]:  # noqa: B008 - frozen struct
        self.paused = True
        return {"rank": self.rank, "paused": True, "mode": req.mode, "step": self.steps}

    def update_weights(self, req: UpdateWeights) -> dict[str, Any]:
        if not self.paused:
            raise WeightsUpdateRejected(f"rank {self.rank}: update_weights needs a paused engine")
        if req.version <= self.version:
            raise ValueError(f"version {req.version} is not newer than {self.version}")
        if req.load_seconds > 0:
            # like a real weight load or NCCL broadcast: the thread blocks (the
            # liveness beacon keeps the rank alive) and reports how far it got
            from ctlwire.kernel.engine.endpoint import report_progress

            shards = 20
            for i in range(shards):
                time.sleep(req.load_seconds / shards)
                report_progress((i + 1) / shards, f"shard {i + 1}/{shards}")
        self.version = req.version
        return {"rank": self.rank, "version": self.version}

    def resume(self) -> dict[str, Any]:
        self.paused = False
        return {"rank": self.rank, "paused": False, "version": self.version}

    def get_server_info(self, tag: int = -1) -> dict[str, Any]:
        self.info_calls += 1
        return {"rank": self.rank, "version": self.version, "paused": self.paused,
                "steps": self.steps, "tokens": self.tokens, "seq": self.info_calls, "tag": tag}

    def get_load(self) -> dict[str, Any]:
        return {"rank": self.rank, "running": 0 if self.paused else 1, "tokens": self.tokens}


def register(ep: EngineEndpoint) -> Callable[[], bool]:
    """Register the simulated engine's methods on ``ep``; returns its step function."""
    engine = SimulatedEngine(ep.rank)
    ep.register("pause", engine.pause)
    ep.register("update_weights", engine.update_weights)
    ep.register("resume", engine.resume)
    ep.register("get_server_info", engine.get_server_info)
    ep.register("get_load", engine.get_load)
    return engine.step
