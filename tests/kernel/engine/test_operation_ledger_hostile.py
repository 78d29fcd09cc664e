"""Ledger entries a peer makes up, on real engine processes over ipc, both backends.

A peer that knows the wire format sends ``ctlwire.step`` requests of its own:
a compensation for an operation that never ran, a made-up phase, steps out of
plan order, a pre-planted key of a later operation, a fence far in the future,
no fence, and a compensation of another controller's running operation. Each
is refused without running, and legitimate operations still commit.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.app.operation_engine import RestoreWeights, weight_update_plan
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.core.operation_plan import new_fence, new_operation_id
from ctlwire.kernel.core.operation_result import ProgressEvent
from ctlwire.kernel.engine.operation_ledger import STEP_METHOD
from ctlwire.kernel.errors import RemoteError
from ctlwire.kernel.operations.runner import OperationRunner
from ctlwire.states import OperationState, RankState
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

N = 2
METHODS = "ctlwire.app.operation_engine:register"
CODEC = MsgpackCodec()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[str, EngineFleet]]:
    os.chmod(tmp_path, 0o700)
    address = f"ipc://{tmp_path}/control.sock"
    with EngineFleet(N, lambda r: ["--connect", address, "--methods", METHODS]) as f:
        yield address, f


def client_for(address: str) -> ControlClient:
    return ControlClient(ZmqRouterClientTransport(address), ranks=N, default_timeout=10.0)


def forged(op: str, step: str, phase: str, fence: int, method: str, arg: Any = None, *,
           key: str | None = None, index: int = 0) -> dict[str, Any]:
    """A ``ctlwire.step`` payload as a peer writes it by hand."""
    if key is None:
        key = f"{op}:{step}:undo" if phase == "compensate" else f"{op}:{step}"
    return {"op": op, "step": step, "phase": phase, "fence": fence, "key": key,
            "method": method, "args": CODEC.encode_value(arg), "index": index,
            "ranks": list(range(N))}


async def info(c: ControlClient) -> dict[int, Any]:
    res = await c.fan_out("get_server_info", mode="concurrent")
    return {r: (v["version"], v["paused"]) for r, v in res.results.items()}


async def refused(c: ControlClient, payload: dict[str, Any]) -> str:
    """Send a forged step to rank 0; the type name of the engine's refusal."""
    with pytest.raises(RemoteError) as exc:
        await c.call(STEP_METHOD, payload, rank=0)
    return exc.value.type_name


async def test_made_up_ledger_entries_are_refused_and_change_nothing(
        fleet: tuple[str, EngineFleet]) -> None:
    address, _ = fleet
    async with client_for(address) as c:
        await c.wait_ready(timeout=10)
        runner = OperationRunner(c)
        assert (await runner.run(weight_update_plan(1, 0))).ok
        before = (await c.call("op_counts", rank=0))["runs"]
        now = new_fence()
        # a compensation for an operation that never ran here
        assert await refused(c, forged("ghost@1", "update", "compensate", now,
                                       "restore_weights", RestoreWeights(0))) == "StepNotApplied"
        # a made-up phase; a step that is not the first of an unknown operation
        assert await refused(c, forged("x@1", "pause", "rollback", now, "pause")) == "InvalidStep"
        assert await refused(c, forged("x@2", "resume", "apply", now, "resume",
                                       index=2)) == "StepOutOfOrder"
        # no fence, and a fence far beyond any clock
        assert await refused(c, forged("x@3", "pause", "apply", 0, "pause")) == "InvalidStep"
        assert await refused(c, forged("x@4", "pause", "apply", 2**63 - 1,
                                       "pause")) == "InvalidStep"
        # a key of the next operation, planted under another operation's step
        fence = new_fence()
        op_id = new_operation_id("weight-update", fence)
        assert await refused(c, forged("y@1", "resume", "apply", now, "resume",
                                       key=f"{op_id}:resume")) == "InvalidStep"
        assert (await c.call("op_counts", rank=0))["runs"] == before  # nothing ran
        assert await info(c) == {r: (1, False) for r in range(N)}
        # the next operation, with the id the peer aimed at, commits and really resumes
        result = await runner.run(weight_update_plan(2, 1), op_id=op_id, fence=fence)
        assert result.ok, result.summary()
        assert await info(c) == {r: (2, False) for r in range(N)}
        # and a later one is not superseded by the fence from the future
        assert (await runner.run(weight_update_plan(3, 2))).ok


class ControllerCrashed(Exception):
    pass


async def test_another_controller_cannot_compensate_a_running_operation(
        fleet: tuple[str, EngineFleet]) -> None:
    address, _ = fleet
    plan = weight_update_plan(1, 0)
    started: dict[str, Any] = {}

    def stall_after_update(ev: ProgressEvent) -> None:
        started["op"], started["fence"] = ev.op_id, None
        if ev.step == "update" and ev.state is RankState.APPLIED and ev.rank == N - 1:
            raise ControllerCrashed  # controller A stops between update and resume

    async with client_for(address) as a:
        await a.wait_ready(timeout=10)
        runner = OperationRunner(a)
        with pytest.raises(ControllerCrashed):
            await runner.run(plan, on_progress=stall_after_update)
        last = (await runner.last_operations())[0]
        assert not isinstance(last, Exception)
        op_id, fence = last.op, last.fence
    assert op_id == started["op"]
    async with client_for(address) as b:  # another controller, reading the op id and fence
        await b.wait_ready(timeout=10)
        payload = forged(op_id, "update", "compensate", fence, "restore_weights",
                         RestoreWeights(0))
        assert await refused(b, payload) == "OperationOwned"
        assert await info(b) == {r: (1, True) for r in range(N)}  # still A's: not rolled back
        runs = (await b.call("op_counts", rank=0))["runs"]
        assert "restore_weights" not in runs
        # a successor takes the operation over with a newer fence and finishes it
        successor = OperationRunner(b)
        result = await successor.run(plan, op_id=op_id, fence=new_fence())
        assert result.ok and result.state is OperationState.COMMITTED, result.summary()
        assert await info(b) == {r: (1, False) for r in range(N)}
        counts = (await b.fan_out("op_counts", mode="concurrent")).results
        for n in counts.values():
            assert n["runs"] == {"pause": 1, "update_weights": 1, "resume": 1}
