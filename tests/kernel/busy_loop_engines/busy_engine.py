"""A busy-loop engine for the BusyLoop tests (``--methods busy_engine:register``,
this folder on ``PYTHONPATH``): a state-changing method and a step that each
hold the loop's thread until a release file appears (``BUSY_RELEASE``, a
directory), and a read-only status the loop publishes whole."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from ctlwire.kernel.engine_endpoint import EngineEndpoint, report_progress


def register(ep: EngineEndpoint) -> Any:
    release = os.environ["BUSY_RELEASE"]
    status: dict[str, Any] = {"phase": "idle", "updates": 0}
    pending: list[str] = []

    def publish(**changes: Any) -> None:
        nonlocal status
        status = {**status, **changes}  # replaced whole: the I/O thread reads it

    def hold(name: str) -> None:
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(release, name)) and time.monotonic() < deadline:
            time.sleep(0.01)

    @ep.method(read_only=True)
    def get_status() -> dict[str, Any]:
        return {**status, "thread": threading.current_thread().name}

    @ep.method()
    def long_update(name: str) -> int:
        publish(phase=f"update:{name}")
        hold(name)
        publish(phase="idle", updates=status["updates"] + 1)
        return int(status["updates"])

    @ep.method()
    def progress_update(name: str) -> bool:
        reported = report_progress(0.5, f"half of {name}")
        hold(name)
        return reported

    @ep.method()
    def block_step(name: str) -> None:
        pending.append(name)

    @ep.method()
    def where() -> str:
        return threading.current_thread().name

    def step() -> bool:
        if not pending:
            return False
        name = pending.pop()
        publish(phase=f"step:{name}")
        hold(name)
        publish(phase="idle")
        return True

    return step
