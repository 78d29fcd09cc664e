"""Post-conditions, on real engine processes over ipc, both backends.

A plan declares what must hold on every rank before it commits (here: the new
weight version, not paused, read through ``get_server_info``). A rank whose
update claimed success without applying fails it, and the operation is
compensated; a quarantined rank is released only once it meets it, or forced.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.app.operation_engine import Fault, weight_update_plan
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.core.operation_plan import PostCondition, PostConditionFailed
from ctlwire.kernel.operations.runner import OperationRunner, ReleaseRefused
from ctlwire.states import OperationState
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

N = 3
METHODS = "ctlwire.app.operation_engine:register"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[str]:
    os.chmod(tmp_path, 0o700)
    address = f"ipc://{tmp_path}/control.sock"
    with EngineFleet(N, lambda r: ["--connect", address, "--methods", METHODS]):
        yield address


async def test_a_rank_that_did_not_reach_the_post_condition_fails_the_operation(
        fleet: str) -> None:
    async with ControlClient(ZmqRouterClientTransport(fleet), ranks=N,
                             default_timeout=10.0) as c:
        await c.wait_ready(timeout=10)
        runner = OperationRunner(c)
        await c.call("arm_fault", Fault("update_weights", "skip"), rank=1)  # claims, no-op
        result = await runner.run(weight_update_plan(1, 0))
        assert result.state is OperationState.ABORTED, result.summary()
        assert result.failed_ranks == (1,) and result.ranks[1].failed_step == "(postcondition)"
        error = result.ranks[1].error
        assert isinstance(error, PostConditionFailed) and error.observed["version"] == 0
        assert {r: v["version"] for r, v in result.observed.items()} == {0: 1, 1: 0, 2: 1}
        assert result.compensated == (0, 1, 2)
        res = await c.fan_out("get_server_info", mode="concurrent")
        assert {r: (v["version"], v["paused"]) for r, v in res.results.items()} == {
            r: (0, False) for r in range(N)}


async def test_release_needs_the_post_condition_or_force(fleet: str) -> None:
    async with ControlClient(ZmqRouterClientTransport(fleet), ranks=N,
                             default_timeout=10.0) as c:
        await c.wait_ready(timeout=10)
        runner = OperationRunner(c)
        await c.call("arm_fault", Fault("update_weights"), rank=2)
        result = await runner.run(weight_update_plan(1, 0, quarantine_on_error=True))
        assert result.quarantined == (2,)
        with pytest.raises(ReleaseRefused) as refused:
            await runner.release(2)  # paused on old weights
        assert refused.value.observed["paused"] is True
        assert runner.routable_ranks() == (0, 1)
        # brought back by hand (still on the old weights, which the fleet runs too)
        await c.call("resume", rank=2)
        await runner.release(2, postcondition=PostCondition(
            "get_server_info", {"version": 0, "paused": False}))
        assert runner.routable_ranks() == (0, 1, 2)
        await c.call("arm_fault", Fault("update_weights"), rank=2)
        await runner.run(weight_update_plan(1, 0, quarantine_on_error=True))
        await runner.release(2, force=True)
        assert runner.routable_ranks() == (0, 1, 2)
