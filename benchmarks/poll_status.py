"""``poll_status``: status pollers during a weight update on busy-loop engines.

Three engine processes, each a synchronous loop doing ~50 ms of array work per
step (numpy when installed, else pure Python, which holds the GIL throughout),
are driven through one operation: pause -> update_weights (the loop's thread
busy for 2 s) -> resume. Meanwhile 50 concurrent callers poll
``get_server_info`` (read-only, a snapshot the loop publishes) with a fan-out
in its default mode. The row reports the pollers' p99 over the calls made
while the operation ran, on ``--mode loop`` engines
(:class:`~ctlwire.kernel.engine.busy_loop.BusyLoop`: read-only methods answered by the
I/O thread), against the same engines on ``--mode poll`` (every request in
turn, on the loop's thread). Target: p99 < 100 ms.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import anyio

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.core.operation_plan import OperationPlan, OperationStep, StepCall
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.engine.operation_ledger import OperationLedger
from ctlwire.kernel.operations.runner import OperationRunner
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

from .report import Row, Target
from .stats import median, percentile

__all__ = ["GROUPS", "register", "rows"]

GROUPS = ("poll_status",)
ENGINES = 3
POLLERS = 50
STEP_S = 0.05
UPDATE_S = 2.0
P99_MS = 100.0
METHODS = "ctlwire.benchmarks.poll_status:register"
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _work(seconds: float) -> None:
    """Array work for ``seconds``: numpy matrix products, else a pure-Python loop."""
    end = time.perf_counter() + seconds
    try:
        import numpy as np  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        while time.perf_counter() < end:
            sum(i * i for i in range(2_000))
        return
    a = np.random.default_rng(0).random((128, 128))
    while time.perf_counter() < end:
        a = (a @ a) / 128.0


def register(ep: EngineEndpoint) -> Callable[[], bool]:
    """The engine: a ~50 ms step, ``pause`` / ``update_weights`` (2 s) / ``resume`` as
    operation steps, and a read-only ``get_server_info`` from a published snapshot."""
    state = {"paused": False, "version": 0, "steps": 0}
    info: dict[str, Any] = dict(state)

    def publish() -> None:
        nonlocal info
        info = dict(state)

    def pause() -> bool:
        state["paused"] = True
        publish()
        return True

    def update_weights(version: int) -> int:
        _work(UPDATE_S)
        state["version"] = version
        publish()
        return version

    def resume() -> bool:
        state["paused"] = False
        publish()
        return True

    handlers: dict[str, Callable[..., Any]] = {
        "pause": pause, "update_weights": update_weights, "resume": resume}
    OperationLedger(handlers).install(ep)
    for name, fn in handlers.items():
        ep.register(name, fn)
    ep.register("get_server_info", lambda: info, read_only=True)

    def step() -> bool:
        if state["paused"]:
            return False
        _work(STEP_S)
        state["steps"] += 1
        publish()
        return True

    return step


def _plan(version: int) -> OperationPlan:
    return OperationPlan("update", (
        OperationStep("pause", "pause", None, 10.0, compensation=StepCall("resume")),
        OperationStep("update", "update_weights", version, 10 + UPDATE_S * 3),
        OperationStep("resume", "resume", None, 10.0),
    ))


async def _measure(address: str, operations: int) -> tuple[list[float], float]:
    """Poller latencies (ms) of the calls started while an operation ran; the
    operations' mean duration (s)."""
    latencies: list[float] = []
    durations: list[float] = []
    running = False
    async with ControlClient(ZmqRouterClientTransport(address), ranks=ENGINES,
                             default_timeout=30.0) as client:
        client.method_kinds.declare_read_only("get_server_info")
        await client.wait_ready(timeout=60)
        runner = OperationRunner(client)
        done = anyio.Event()

        async def poller() -> None:
            while not done.is_set():
                during = running
                start = time.perf_counter()
                await client.fan_out("get_server_info")
                if during:
                    latencies.append((time.perf_counter() - start) * 1e3)

        async with anyio.create_task_group() as tg:
            for _ in range(POLLERS):
                tg.start_soon(poller)
            await anyio.sleep(0.5)  # the pollers and the loops settle
            for version in range(1, operations + 1):
                running = True
                start = time.perf_counter()
                result = await runner.run(_plan(version))
                durations.append(time.perf_counter() - start)
                running = False
                if result.state.name != "COMMITTED":
                    raise RuntimeError(f"the operation ended {result.state.name}")
                await anyio.sleep(0.3)
            done.set()
    return latencies, sum(durations) / len(durations)


def _run(mode: str, operations: int) -> tuple[list[float], float]:
    with tempfile.TemporaryDirectory(prefix="ctlwire-poll-status-") as folder:
        os.chmod(folder, 0o700)
        address = f"ipc://{folder}/control.sock"
        # one thread of array work per engine, as an engine pinned to its core runs
        env = {**os.environ, **{k: "1" for k in _THREAD_VARS}}
        with EngineFleet(ENGINES, lambda r: ["--connect", address, "--methods", METHODS,
                                             "--mode", mode], env=env):
            return anyio.run(_measure, address, operations)


def rows(quick: bool, say: Callable[[str], None]) -> list[Row]:
    """Poll mode, then loop mode, alternating; the loop-mode p99 against the poll-mode one."""
    operations = 1 if quick else 2
    rounds = 1 if quick else 2
    loop: list[float] = []
    poll: list[float] = []
    seconds: list[float] = []
    for _ in range(rounds):
        for mode, into in (("poll", poll), ("loop", loop)):
            latencies, took = _run(mode, operations)
            into.extend(latencies)
            if mode == "loop":
                seconds.append(took)
            say(f"poll_status: --mode {mode}: {len(latencies)} polls, p50 "
                f"{median(latencies):.1f} ms, p99 {percentile(latencies, 99):.1f} ms")
    try:
        import numpy  # noqa: F401
        work = "numpy"
    except ImportError:
        work = "pure Python (numpy not installed)"
    p99 = percentile(loop, 99)
    details = {"pollers": POLLERS, "engines": ENGINES, "update_s": UPDATE_S, "step_ms": 50,
               "step_work": work, "polls": len(loop), "p50_ms": round(median(loop), 2),
               "p99_ms": round(p99, 2), "poll_mode_p50_ms": round(median(poll), 2),
               "poll_mode_p99_ms": round(percentile(poll, 99), 2),
               "operation_s": round(median(seconds), 2),
               "note": "fan-out default mode: get_server_info declared read-only (watching)"}
    return [Row("poll_status", f"{POLLERS} status pollers during a {UPDATE_S:g} s update, "
                f"{ENGINES} busy-loop engines: p99", "ms", p99, percentile(poll, 99),
                "the same engines in --mode poll (requests in turn on the loop's thread)",
                p99, "pollers' p99 (ms)", Target("<=", P99_MS), details, " ms")]
