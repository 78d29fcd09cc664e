"""A quarantined rank in a status fan-out, and the catch-up of a restarted rank.

A fan-out without explicit ranks leaves a quarantined rank out: its summary says so
and its table lists every rank, the one left out included. A rank quarantined by a
failed weight update, then restarted on its old weights, is refused by ``release()``
(its post-condition does not hold) and brought back by ``catch_up()``: the plan
run on that rank alone, released when its post-condition holds there.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from ctlwire.kernel import (
    EngineEndpoint,
    InvalidPlan,
    OperationLedger,
    OperationPlan,
    OperationRunner,
    OperationStep,
    PostCondition,
    ReleaseRefused,
    StepCall,
)
from ctlwire.states import OperationState

pytestmark = [pytest.mark.anyio, pytest.mark.ctlwire_virtual_clock]


def setup(ep: EngineEndpoint) -> None:
    """An engine whose weights are a version; ``arm_fault`` makes its next update raise."""
    state: dict[str, Any] = {"version": 0, "paused": False, "fault": False}

    def pause() -> None:
        state["paused"] = True

    def resume() -> None:
        state["paused"] = False

    def update_weights(version: int) -> int:
        if state["fault"]:
            state["fault"] = False
            raise RuntimeError("checkpoint unreadable")
        state["version"] = version
        return version

    OperationLedger({"pause": pause, "resume": resume,
                     "update_weights": update_weights}).install(ep)
    ep.register("get_server_info", lambda: {"version": state["version"],
                                            "paused": state["paused"]}, read_only=True)
    ep.register("arm_fault", lambda: state.update(fault=True))


def plan(version: int) -> OperationPlan:
    return OperationPlan("weight-sync", (
        OperationStep("pause", "pause", compensation=StepCall("resume")),
        OperationStep("update", "update_weights", version, quarantine_on_error=True),
        OperationStep("resume", "resume", compensation=StepCall("pause")),
    ), PostCondition("get_server_info", {"version": version, "paused": False}))


async def test_a_status_fan_out_names_the_rank_it_left_out(ctlwire_harness: Any) -> None:
    async with ctlwire_harness(ranks=3, setup=setup) as h:
        runner = OperationRunner(h.client)
        runner.quarantine(1, detail="left mid-operation")
        res = await h.client.fan_out("get_server_info", timeout=10)
    assert not res.ok and sorted(res.results) == [0, 2]  # a rank left out counts
    assert res.summary() == ("get_server_info: 2 ok (ranks 0, 2); "
                             "1 left out (rank 1: quarantined)")
    table = res.table()
    assert [(row.rank, row.status) for row in table] == [
        (0, "ok"), (1, "left out"), (2, "ok")]
    assert table[0].value == {"version": 0, "paused": False} and table[0].error is None
    assert table[1].reason == "quarantined" and table[1].value is None
    assert str(table[1]) == "rank 1: left out (quarantined)"


async def test_a_table_has_errors_and_pending_ranks_too(ctlwire_harness: Any) -> None:
    async with ctlwire_harness(ranks=2, setup=setup) as h:
        res = await h.client.fan_out("no_such_method", timeout=10)
    assert not res.ok
    assert [(row.rank, row.status, type(row.error).__name__) for row in res.table()] == [
        (0, "error", "UnknownMethod"), (1, "error", "UnknownMethod")]
    assert res.summary().startswith("no_such_method: 0 ok; 2 failed (rank 0: UnknownMethod")


async def test_a_restarted_rank_catches_up_alone_and_is_released(ctlwire_harness: Any
                                                                 ) -> None:
    async with ctlwire_harness(ranks=3, setup=setup) as h:
        runner = OperationRunner(h.client)
        await h.client.call("arm_fault", rank=1, timeout=10)
        first = await runner.run(plan(1))
        assert first.state is OperationState.DEGRADED and first.quarantined == (1,)
        # the rank restarts on its old weights: still quarantined, and release refuses it
        old = h.client.rank_status(1)["incarnation"]
        h.stop_engine(1)
        with anyio.fail_after(10):  # the client has seen the old process go
            while h.client.rank_status(1)["alive"]:
                await anyio.sleep(0.01)
        await h.start_engine(1)
        await h.client.wait_ready(timeout=10)
        assert h.client.rank_status(1)["incarnation"] != old
        with pytest.raises(ReleaseRefused, match="version"):
            await runner.release(1)
        assert runner.routable_ranks() == (0, 2)
        # the fleet's version, on that rank alone
        result = await runner.catch_up(plan(1), 1)
        assert result.ok and result.committed == (1,) and result.observed[1]["version"] == 1
        assert runner.routable_ranks() == (0, 1, 2) and 1 not in runner.quarantined
        info = await h.client.fan_out("get_server_info", timeout=10)
    assert info.results == {r: {"version": 1, "paused": False} for r in range(3)}
    assert info.left_out == {}
    assert runner.metrics()["released"] == 1


async def test_a_failed_catch_up_keeps_the_rank_quarantined(ctlwire_harness: Any) -> None:
    async with ctlwire_harness(ranks=2, setup=setup) as h:
        runner = OperationRunner(h.client)
        runner.quarantine(1, detail="restarted")
        await h.client.call("arm_fault", rank=1, timeout=10)
        result = await runner.catch_up(plan(1), 1)
        assert not result.ok and 1 in runner.quarantined
        assert runner.quarantined[1].op_id == result.op_id  # why it is held now
        with pytest.raises(InvalidPlan, match="post-condition"):
            await runner.catch_up(OperationPlan("bare", plan(1).steps), 1)
        with pytest.raises(InvalidPlan, match="not quarantined"):
            await runner.catch_up(plan(1), 0)


async def test_release_checks_what_the_fleet_serves_not_the_quarantining_plan(
        ctlwire_harness: Any) -> None:
    async with ctlwire_harness(ranks=3, setup=setup) as h:
        runner = OperationRunner(h.client)
        # held while on version 0, with what it had to meet then
        runner.quarantine(2, detail="restarted", postcondition=PostCondition(
            "get_server_info", {"version": 0, "paused": False}))
        result = await runner.run(plan(1))  # the fleet moves on without it
        assert result.state is OperationState.COMMITTED and result.committed == (0, 1)
        assert not result.ok and result.left_out == {2: "quarantined"}
        assert h.client.quarantine.serving == plan(1).postcondition
        # its record's post-condition holds (version 0); the fleet serves version 1
        with pytest.raises(ReleaseRefused, match="'version': 1"):
            await runner.release(2)
        assert 2 in runner.quarantined
        caught_up = await runner.catch_up(plan(1), 2)
        assert caught_up.ok and 2 not in runner.quarantined
        info = await h.client.fan_out("get_server_info", timeout=10)
    assert info.ok and {r: v["version"] for r, v in info.results.items()} == {0: 1, 1: 1, 2: 1}
