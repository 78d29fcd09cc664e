"""The engine side of the examples: one engine rank's control methods.

Each engine process runs ``python -m ctlwire.app.engine_process --methods
engine_methods:register`` (the examples put this folder on ``PYTHONPATH``).
Payload types are ``msgspec.Struct``s (any msgspec-supported type works): the
endpoint validates every payload against the handler's annotation before the
handler runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import msgspec

from ctlwire.kernel import EngineEndpoint, OperationLedger, report_progress


class UpdateWeights(msgspec.Struct, frozen=True):
    version: int
    path: str = ""
    load_seconds: float = 0.008  # how long "loading" the checkpoint takes


class RestoreWeights(msgspec.Struct, frozen=True):
    version: int


class Pause(msgspec.Struct, frozen=True):
    mode: str = "drain"


class Engine:
    """A stand-in for an inference engine: a generation step, weights, a pause flag."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.version = 0
        self.paused = False
        self.steps = 0

    def step(self) -> bool:
        if self.paused:
            return False
        time.sleep(0.001)  # one "generation step"
        self.steps += 1
        return True

    def pause(self, req: Pause = Pause()) -> dict[str, Any]:  # noqa: B008 - frozen struct
        self.paused = True
        return {"rank": self.rank, "paused": True, "mode": req.mode}

    def resume(self) -> dict[str, Any]:
        self.paused = False
        return {"rank": self.rank, "paused": False, "version": self.version}

    def update_weights(self, req: UpdateWeights) -> dict[str, Any]:
        for i in range(4):  # "load" the checkpoint in shards, saying how far it got
            time.sleep(req.load_seconds / 4)
            report_progress((i + 1) / 4, f"shard {i + 1}/4 of {req.path or 'v' + str(req.version)}")
        self.version = max(self.version, req.version)  # an older version is a no-op
        return {"rank": self.rank, "version": self.version}

    def restore_weights(self, req: RestoreWeights) -> dict[str, Any]:
        self.version = req.version
        return {"rank": self.rank, "version": self.version}

    def get_server_info(self) -> dict[str, Any]:
        return {"rank": self.rank, "version": self.version, "paused": self.paused,
                "steps": self.steps, "pid": os.getpid()}


def register(ep: EngineEndpoint) -> Callable[[], bool]:
    """Register the allow-listed methods (and the operation ledger) on ``ep``."""
    engine = Engine(ep.rank)
    OperationLedger({"pause": engine.pause, "update_weights": engine.update_weights,
                     "restore_weights": engine.restore_weights,
                     "resume": engine.resume}).install(ep)
    ep.register("pause", engine.pause)
    ep.register("resume", engine.resume)
    ep.register("update_weights", engine.update_weights)
    ep.register("get_server_info", engine.get_server_info)
    return engine.step
