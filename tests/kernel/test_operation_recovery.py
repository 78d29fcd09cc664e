"""A successor finishes what a dead controller left, on real engine processes, both backends.

The engines' ledgers record every step and every compensation they ran, so a
new controller learns per rank what remains (:meth:`OperationRunner.recover`)
and does it in one call (:meth:`OperationRunner.finish`): the rest of an
interrupted compensation, or the rest of an interrupted forward run. Nothing
runs twice, and no rank is left paused.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.app.operation_engine import Fault, weight_update_plan
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.core.operation_result import ProgressEvent
from ctlwire.kernel.operations.runner import OperationRunner
from ctlwire.states import OperationState, RankState
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


def client_for(address: str) -> ControlClient:
    return ControlClient(ZmqRouterClientTransport(address), ranks=N, default_timeout=10.0)


async def info(c: ControlClient) -> dict[int, Any]:
    res = await c.fan_out("get_server_info", mode="concurrent")
    return {r: (v["version"], v["paused"]) for r, v in res.results.items()}


async def runs(c: ControlClient) -> dict[int, dict[str, int]]:
    res = await c.fan_out("op_counts", mode="concurrent")
    return {r: n["runs"] for r, n in res.results.items()}


class ControllerCrashed(Exception):
    pass


async def test_an_interrupted_compensation_is_finished_by_a_successor(fleet: str) -> None:
    plan = weight_update_plan(1, 0)

    seen: list[ProgressEvent] = []

    def crash_between_compensations(ev: ProgressEvent) -> None:
        # rank 2's update raised; the others' updates are undone (rank 1's is the
        # second compensating event of rank 1: the first enters compensation), then
        # the controller dies before any pause is undone
        seen.append(ev)
        if ev.rank == 1 and [(e.phase, e.state) for e in seen if e.rank == 1].count(
                ("compensate", RankState.COMPENSATING)) == 2:
            raise ControllerCrashed

    async with client_for(fleet) as c:
        await c.wait_ready(timeout=10)
        await c.call("arm_fault", Fault("update_weights"), rank=2)
        with pytest.raises(ControllerCrashed):
            await OperationRunner(c).run(plan, on_progress=crash_between_compensations)
        assert await info(c) == {r: (0, True) for r in range(N)}  # undone, still paused
    async with client_for(fleet) as c2:  # the successor
        await c2.wait_ready(timeout=10)
        runner = OperationRunner(c2)
        recovery = await runner.recover(plan)
        assert recovery is not None and recovery.action == "compensate"
        assert recovery.ranks == (0, 1, 2) and recovery.missing == ()
        assert recovery.steps == {0: ("pause", "update"), 1: ("pause", "update"),
                                  2: ("pause",)}
        assert recovery.undone == {0: ("update",), 1: ("update",), 2: ()}
        assert recovery.remaining == {r: ("pause",) for r in range(N)}
        result = await runner.finish(plan, recovery)
        assert result.state is OperationState.ABORTED, result.summary()
        assert result.op_id == recovery.op_id and result.compensated == (0, 1, 2)
        assert result.ranks[0].undone == ("update", "pause")
        assert result.ranks[2].undone == ("pause",)
        assert await info(c2) == {r: (0, False) for r in range(N)}  # resumed, old weights
        assert await runs(c2) == {
            0: {"pause": 1, "update_weights": 1, "restore_weights": 1, "resume": 1},
            1: {"pause": 1, "update_weights": 1, "restore_weights": 1, "resume": 1},
            2: {"pause": 1, "resume": 1}}
        done = await runner.recover(plan)
        assert done is not None and done.remaining == {r: () for r in range(N)}


async def test_an_interrupted_forward_run_is_rolled_forward_by_a_successor(fleet: str) -> None:
    plan = weight_update_plan(1, 0)

    def crash_mid_update(ev: ProgressEvent) -> None:
        if ev.step == "update" and ev.state is RankState.APPLIED and ev.rank == 0:
            raise ControllerCrashed  # rank 0 updated; ranks 1 and 2 answered nothing yet

    async with client_for(fleet) as c:
        await c.wait_ready(timeout=10)
        with pytest.raises(ControllerCrashed):
            await OperationRunner(c).run(plan, on_progress=crash_mid_update)
    async with client_for(fleet) as c2:
        await c2.wait_ready(timeout=10)
        runner = OperationRunner(c2)
        recovery = await runner.recover(plan)
        assert recovery is not None and recovery.action == "roll_forward"
        assert recovery.remaining[0] == ("resume",)
        result = await runner.finish(plan, recovery)
        assert result.ok and result.op_id == recovery.op_id, result.summary()
        assert result.fence > recovery.fence
        assert await info(c2) == {r: (1, False) for r in range(N)}
        assert await runs(c2) == {r: {"pause": 1, "update_weights": 1, "resume": 1}
                                  for r in range(N)}
