"""The whole plan is checked before its first step, on real engine processes, both backends.

A later step or compensation that cannot be sent (a payload that does not
encode or does not fit, a method an engine does not run as a step) is found
before anything of the plan goes out: a typed error, no rank touched. A
failure that only shows at dispatch is a failure of that step: compensation
and a result, never an exception out of ``run()`` with ranks left paused.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctlwire.app.demo_engine import Pause, UpdateWeights
from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.app.operation_engine import RestoreWeights
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.core.operation_plan import (
    InvalidPlan,
    OperationPlan,
    OperationStep,
    StepCall,
)
from ctlwire.kernel.core.operation_result import ProgressEvent
from ctlwire.kernel.operations.runner import OperationRunner
from ctlwire.states import OperationState, RankState
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

N = 2
METHODS = "ctlwire.app.operation_engine:register"
LIMIT = 1 << 16  # the client's frame limit in these tests


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[str, EngineFleet]]:
    os.chmod(tmp_path, 0o700)
    address = f"ipc://{tmp_path}/control.sock"
    with EngineFleet(N, lambda r: ["--connect", address, "--methods", METHODS]) as f:
        yield address, f


def client_for(address: str) -> ControlClient:
    transport = ZmqRouterClientTransport(address, codec=MsgpackCodec(max_message_size=LIMIT))
    return ControlClient(transport, ranks=N, default_timeout=10.0)


def plan_with(update: Any = None, restore: Any = None, resume_method: str = "resume"
              ) -> OperationPlan:
    return OperationPlan("weight-update", (
        OperationStep("pause", "pause", Pause(), 10, compensation=StepCall("resume")),
        OperationStep("update", "update_weights",
                      update if update is not None else UpdateWeights(1), 10,
                      compensation=StepCall("restore_weights",
                                            restore if restore is not None
                                            else RestoreWeights(0))),
        OperationStep("resume", resume_method, None, 10),
    ))


async def untouched(c: ControlClient) -> None:
    """No rank was paused and no step ran anywhere."""
    res = await c.fan_out("get_server_info", mode="concurrent")
    assert {r: (v["version"], v["paused"]) for r, v in res.results.items()} == {
        r: (0, False) for r in range(N)}
    counts = await c.fan_out("op_counts", mode="concurrent")
    assert all(n["runs"] == {} for n in counts.results.values())


@pytest.mark.parametrize("timeout", [0, -1.0, math.nan, math.inf, "5", True])
def test_a_step_timeout_is_checked_when_the_step_is_declared(timeout: Any) -> None:
    with pytest.raises(InvalidPlan, match="timeout"):
        OperationStep("pause", "pause", timeout=timeout)
    with pytest.raises(InvalidPlan, match="timeout"):
        StepCall("resume", timeout=timeout)


async def test_a_later_payload_that_cannot_be_sent_is_found_before_the_first_step(
        fleet: tuple[str, EngineFleet]) -> None:
    address, _ = fleet
    async with client_for(address) as c:
        await c.wait_ready(timeout=10)
        runner = OperationRunner(c)
        # a compensation whose payload does not encode
        with pytest.raises(InvalidPlan, match="compensation of 'update'") as exc:
            await runner.run(plan_with(restore=object()))
        assert "encode" in str(exc.value)
        # a later step whose request would exceed the frame limit
        with pytest.raises(InvalidPlan, match="step 'update'") as exc:
            await runner.run(plan_with(update=UpdateWeights(1, "x" * LIMIT)))
        assert "RequestTooLarge" in str(exc.value) or "exceeds" in str(exc.value)
        await untouched(c)
        assert runner.metrics()["operations"] == 0


async def test_a_method_an_engine_does_not_run_as_a_step_is_found_first(
        fleet: tuple[str, EngineFleet]) -> None:
    address, _ = fleet
    async with client_for(address) as c:
        await c.wait_ready(timeout=10)
        runner = OperationRunner(c)
        with pytest.raises(InvalidPlan) as exc:
            await runner.run(plan_with(resume_method="resume_generation"))
        assert [p for p in exc.value.problems if "resume_generation" in p] == [
            f"rank {r} runs no operation step resume_generation (it declares pause, "
            "restore_weights, resume, update_weights)" for r in range(N)]
        await untouched(c)
        assert await runner.step_methods() == {
            r: ("pause", "restore_weights", "resume", "update_weights") for r in range(N)}


async def test_a_payload_that_stops_fitting_at_dispatch_is_a_step_failure(
        fleet: tuple[str, EngineFleet]) -> None:
    """The update's payload grows after the plan was checked (a buffer filled
    meanwhile): its dispatch is refused by the client, and every rank's pause is
    compensated; ``run()`` returns a result."""
    address, _ = fleet
    shards: list[str] = []
    plan = OperationPlan("weight-update", (
        OperationStep("pause", "pause", Pause(), 10, compensation=StepCall("resume")),
        OperationStep("update", "update_weights", {"version": 1, "path": "", "shards": shards},
                      10, compensation=StepCall("restore_weights", RestoreWeights(0))),
        OperationStep("resume", "resume", None, 10),
    ))

    def grow(ev: ProgressEvent) -> None:
        if ev.step == "pause" and ev.state is RankState.APPLIED:
            shards.append("x" * LIMIT)

    async with client_for(address) as c:
        await c.wait_ready(timeout=10)
        runner = OperationRunner(c)
        result = await runner.run(plan, on_progress=grow)
        assert result.state is OperationState.ABORTED, result.summary()
        assert result.failed_ranks == (0, 1)
        assert all(rep.failed_step == "update" for rep in result.ranks.values())
        assert result.compensated == (0, 1)
        assert all(rep.undone == ("pause",) for rep in result.ranks.values())
        res = await c.fan_out("get_server_info", mode="concurrent")
        assert all(not v["paused"] and v["version"] == 0 for v in res.results.values())
