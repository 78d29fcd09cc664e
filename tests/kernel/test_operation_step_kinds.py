"""Async and threaded ledger steps, on real engine processes (``--mode serve``), both backends.

An ``async def`` step is awaited and recorded only once its body returned; a
step that raises after its await is not recorded. A long threaded step leaves
the engine answering other methods, and the client's view of the rank names
the step's own method while it runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.app.operation_engine import Fault, weight_update_plan
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.core.operation_result import OperationResult
from ctlwire.kernel.operations.runner import OperationRunner
from ctlwire.states import OperationState
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

N = 2


def start_fleet(tmp_path: Path, methods: str) -> tuple[str, EngineFleet]:
    os.chmod(tmp_path, 0o700)
    address = f"ipc://{tmp_path}/control.sock"
    return address, EngineFleet(N, lambda r: ["--connect", address, "--methods", methods,
                                              "--mode", "serve"])


@pytest.fixture
def async_fleet(tmp_path: Path) -> Iterator[str]:
    address, fleet = start_fleet(tmp_path, "ctlwire.app.operation_engine:register_async")
    with fleet:
        yield address


@pytest.fixture
def threaded_fleet(tmp_path: Path) -> Iterator[str]:
    address, fleet = start_fleet(tmp_path,
                                 "ctlwire.app.operation_engine:register_threaded")
    with fleet:
        yield address


def client_for(address: str) -> ControlClient:
    return ControlClient(ZmqRouterClientTransport(address), ranks=N, default_timeout=10.0)


async def info(c: ControlClient) -> dict[int, Any]:
    res = await c.fan_out("get_server_info", mode="concurrent")
    return {r: (v["version"], v["paused"]) for r, v in res.results.items()}


async def test_async_steps_are_awaited_and_recorded_after_they_returned(
        async_fleet: str) -> None:
    async with client_for(async_fleet) as c:
        await c.wait_ready(timeout=10)
        runner = OperationRunner(c)
        result = await runner.run(weight_update_plan(1, 0))
        assert result.ok, result.summary()
        assert await info(c) == {r: (1, False) for r in range(N)}  # the bodies ran
        counts = (await c.fan_out("op_counts", mode="concurrent")).results
        assert all(n["runs"] == {"pause": 1, "update_weights": 1, "resume": 1}
                   for n in counts.values())
        # an async step that raises after its await is not recorded as applied
        await c.call("arm_fault", Fault("update_weights"), rank=1)
        failed = await runner.run(weight_update_plan(2, 1))
        assert failed.state is OperationState.ABORTED and failed.failed_ranks == (1,)
        assert failed.ranks[1].applied == ("pause",) and failed.ranks[0].applied == (
            "pause", "update")
        lasts = await runner.last_operations()
        last1 = lasts[1]
        assert not isinstance(last1, Exception)
        assert (last1.op, last1.steps, last1.undone) == (failed.op_id, ["pause"], ["pause"])
        assert await info(c) == {r: (1, False) for r in range(N)}  # rank 0 restored


async def test_a_long_threaded_step_leaves_the_engine_answering(threaded_fleet: str) -> None:
    async with client_for(threaded_fleet) as c:
        await c.wait_ready(timeout=10)
        runner = OperationRunner(c)
        results: list[OperationResult] = []

        async def run() -> None:
            results.append(await runner.run(weight_update_plan(1, 0, load_seconds=4.0)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            # the client sees each rank running the step's own method
            with anyio.fail_after(30):
                while not all(c.rank_status(r)["method"] == "update_weights"
                              for r in range(N)):
                    await anyio.sleep(0.02)
            # and the engines answer another method while the step runs
            load = await c.fan_out("get_load", mode="concurrent", timeout=2.0)
            assert sorted(load.results) == list(range(N)) and not load.errors
            snapshot = next(iter(runner.progress().values()))
            assert (snapshot["step"], snapshot["in_flight"]) == ("update", True)
        assert results[0].ok, results[0].summary()
        assert await info(c) == {r: (1, False) for r in range(N)}
