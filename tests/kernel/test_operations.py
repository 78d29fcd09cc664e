"""Coordinated operations on real engine processes over ipc, both backends.

pause -> update_weights -> resume across three ranks as one operation
(kernel.operation_engine): a rank whose update raises, a rank killed
mid-operation, a stale operation fenced out, and a retry after the
controller's restart that applies nothing twice (counted in the engines).
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
from ctlwire.kernel.core.operation_plan import new_fence
from ctlwire.kernel.core.operation_result import ProgressEvent
from ctlwire.kernel.operations.runner import OperationRunner, ReleaseRefused
from ctlwire.states import OperationState, RankState
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

N = 3
METHODS = "ctlwire.app.operation_engine:register"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[str, EngineFleet]]:
    os.chmod(tmp_path, 0o700)
    address = f"ipc://{tmp_path}/control.sock"
    with EngineFleet(N, lambda r: ["--connect", address, "--methods", METHODS]) as f:
        yield address, f


def client_for(address: str) -> ControlClient:
    return ControlClient(ZmqRouterClientTransport(address), ranks=N, default_timeout=10.0)


async def info(c: ControlClient, ranks: tuple[int, ...] = tuple(range(N))) -> dict[int, Any]:
    res = await c.fan_out("get_server_info", ranks=ranks, mode="concurrent")
    return {r: (v["version"], v["paused"]) for r, v in res.results.items()}


async def counts(c: ControlClient, ranks: tuple[int, ...] = tuple(range(N))) -> dict[int, Any]:
    res = await c.fan_out("op_counts", ranks=ranks, mode="concurrent")
    return res.results


async def test_commit_on_every_rank_with_progress(fleet: tuple[str, EngineFleet]) -> None:
    address, _ = fleet
    async with client_for(address) as c:
        await c.wait_ready(timeout=10)
        runner = OperationRunner(c)
        seen: list[ProgressEvent] = []
        result = await runner.run(weight_update_plan(1, 0), on_progress=seen.append)
        assert result.ok and result.committed == (0, 1, 2), result.summary()
        for r in range(N):
            assert [(e.step, e.state) for e in seen if e.rank == r] == [
                ("pause", RankState.APPLYING), ("pause", RankState.APPLIED),
                ("update", RankState.APPLYING), ("update", RankState.APPLIED),
                ("resume", RankState.APPLYING), ("resume", RankState.APPLIED),
                ("(postcondition)", RankState.APPLYING), ("(postcondition)", RankState.APPLIED),
                ("(postcondition)", RankState.COMMITTED)]
        # each rank's post-condition answer: the version it really runs
        assert {r: (v["version"], v["paused"]) for r, v in result.observed.items()} == {
            r: (1, False) for r in range(N)}
        assert await info(c) == {r: (1, False) for r in range(N)}
        for r, n in (await counts(c)).items():
            assert n["runs"] == {"pause": 1, "update_weights": 1, "resume": 1}, r
            assert n["highest_fence"] == result.fence
        lasts = await runner.last_operations()
        assert {r: (v.op, v.step) for r, v in lasts.items()} == {  # type: ignore[union-attr]
            r: (result.op_id, "resume") for r in range(N)}
        assert runner.metrics()["committed"] == 1 and runner.progress() == {}


async def test_update_raises_on_one_rank_others_compensated(
        fleet: tuple[str, EngineFleet]) -> None:
    address, _ = fleet
    async with client_for(address) as c:
        await c.wait_ready(timeout=10)
        runner = OperationRunner(c)
        await c.call("arm_fault", Fault("update_weights"), rank=1)
        result = await runner.run(weight_update_plan(1, 0))
        assert result.state is OperationState.ABORTED, result.summary()
        assert result.failed_ranks == (1,)
        assert "InjectedFault" in result.ranks[1].detail
        assert result.compensated == (0, 1, 2)
        assert result.ranks[0].undone == ("update", "pause")
        assert result.ranks[1].undone == ("pause",)  # its update never applied
        assert await info(c) == {r: (0, False) for r in range(N)}  # old weights, resumed
        assert runner.routable_ranks() == (0, 1, 2)
        # the same failure, declared to quarantine: rank 1 stays paused, out of routing
        await c.call("arm_fault", Fault("update_weights"), rank=1)
        result = await runner.run(weight_update_plan(1, 0, quarantine_on_error=True))
        assert result.state is OperationState.DEGRADED and result.quarantined == (1,)
        assert result.compensated == (0, 2)
        assert await info(c) == {0: (0, False), 1: (0, True), 2: (0, False)}
        assert runner.routable_ranks() == (0, 2)
        assert runner.metrics()["quarantined"][1]["step"] == "update"


async def test_killed_rank_is_quarantined_and_skipped_until_released(
        fleet: tuple[str, EngineFleet]) -> None:
    address, engines = fleet
    async with client_for(address) as c:
        await c.wait_ready(timeout=10)
        runner = OperationRunner(c)
        await c.call("arm_fault", Fault("update_weights", "crash"), rank=2)
        result = await runner.run(weight_update_plan(1, 0))
        assert result.state is OperationState.DEGRADED, result.summary()
        assert result.quarantined == (2,) and result.compensated == (0, 1)
        assert result.ranks[2].failed_step == "update"
        assert engines.engines[2].proc.wait(timeout=10) == 9  # it really died (os._exit(9))
        assert await info(c, (0, 1)) == {0: (0, False), 1: (0, False)}
        assert runner.routable_ranks() == (0, 1)
        assert list(runner.metrics()["quarantined"]) == [2]
        # later fan-outs and operations skip it
        res = await c.fan_out("get_load", ranks=runner.routable_ranks(), mode="concurrent")
        assert sorted(res.results) == [0, 1]
        # committed on the two ranks it ran on, and not ok: the fleet has a rank out
        again = await runner.run(weight_update_plan(2, 0))
        assert again.state is OperationState.COMMITTED and again.committed == (0, 1)
        assert not again.ok and again.left_out == {2: "quarantined"}, again.summary()
        assert again.summary().endswith("; 1 left out (rank 2: quarantined)")
        only = await runner.run(weight_update_plan(3, 2), ranks="admissible")
        assert only.ok and only.left_out == {2: "quarantined"} and only.admissible_only
        with pytest.raises(ValueError, match="quarantined"):
            await runner.run(weight_update_plan(4, 3), ranks=(1, 2))
        # the rank comes back (a new process) on its old weights: its release is refused
        # until forced (or until it meets the post-condition), then it joins the next one
        engines.restart(2)
        await c.wait_ready(timeout=10)
        with pytest.raises(ReleaseRefused, match="version"):
            await runner.release(2)
        assert runner.routable_ranks() == (0, 1)
        await runner.release(2, force=True)
        assert runner.routable_ranks() == (0, 1, 2)
        third = await runner.run(weight_update_plan(4, 3))
        assert third.ok and third.committed == (0, 1, 2), third.summary()
        assert await info(c) == {r: (4, False) for r in range(N)}


async def test_stale_operation_is_refused_by_every_engine(
        fleet: tuple[str, EngineFleet]) -> None:
    address, _ = fleet
    async with client_for(address) as c:
        await c.wait_ready(timeout=10)
        stale_fence = new_fence()      # minted by the controller that was replaced
        newer = OperationRunner(c)
        first = await newer.run(weight_update_plan(1, 0))  # its successor's operation
        assert first.ok and first.fence > stale_fence
        stale = OperationRunner(c)
        result = await stale.run(weight_update_plan(2, 1), fence=stale_fence)
        assert result.state is OperationState.SUPERSEDED, result.summary()
        assert result.superseded == (0, 1, 2)
        assert all("Fenced" in rep.detail for rep in result.ranks.values())
        assert all(rep.applied == () for rep in result.ranks.values())
        assert await info(c) == {r: (1, False) for r in range(N)}
        for n in (await counts(c)).values():
            assert n["fenced"] == 1 and n["highest_fence"] == first.fence
            assert n["runs"] == {"pause": 1, "update_weights": 1, "resume": 1}
        assert stale.routable_ranks() == (0, 1, 2)  # superseded is not quarantined


class ControllerCrashed(Exception):
    pass


async def test_retry_after_controller_restart_applies_nothing_twice(
        fleet: tuple[str, EngineFleet]) -> None:
    address, _ = fleet
    plan = weight_update_plan(1, 0)
    updated: set[int] = set()

    def crash_after_update(ev: ProgressEvent) -> None:
        if ev.step == "update" and ev.state is RankState.APPLIED:
            updated.add(ev.rank)
            if len(updated) == N:
                raise ControllerCrashed  # the controller dies before sending resume

    async with client_for(address) as c:
        await c.wait_ready(timeout=10)
        with pytest.raises(ControllerCrashed):
            await OperationRunner(c).run(plan, on_progress=crash_after_update)
        assert await info(c) == {r: (1, True) for r in range(N)}  # left mid-operation
    # a new controller (new client, new process state) picks it up
    async with client_for(address) as c2:
        await c2.wait_ready(timeout=10)
        runner = OperationRunner(c2)
        recovery = await runner.recover(plan)
        assert recovery is not None
        assert recovery.steps == {r: ("pause", "update") for r in range(N)}
        assert not recovery.complete and not recovery.compensated
        # it takes the operation over with a newer fence (the dead one's is fenced out)
        result = await runner.run(plan, op_id=recovery.op_id, fence=new_fence())
        assert result.ok and result.op_id == recovery.op_id, result.summary()
        assert result.fence > recovery.fence
        assert await info(c2) == {r: (1, False) for r in range(N)}
        for r, n in (await counts(c2)).items():
            assert n["runs"] == {"pause": 1, "update_weights": 1, "resume": 1}, r
            assert n["replayed"] == 2, r  # pause and update answered from the ledger
        # and the whole operation once more: every step replays, nothing runs
        again = await runner.run(plan, op_id=recovery.op_id, fence=result.fence)
        assert again.ok
        done = await runner.recover(plan)
        assert done is not None and done.complete and done.op_id == recovery.op_id
        for n in (await counts(c2)).values():
            assert n["runs"] == {"pause": 1, "update_weights": 1, "resume": 1}
            assert n["replayed"] == 5


async def test_stale_controller_mid_operation_cannot_apply_after_its_successor(
        fleet: tuple[str, EngineFleet]) -> None:
    """Controller A pauses every rank, stalls; B runs a whole update; A wakes up and
    tries to apply its weights: every engine refuses, and A compensates nothing."""
    import anyio

    from ctlwire.kernel.core.operation_core import Dispatch, StepOutcome

    address, _ = fleet
    paused = anyio.Event()
    go_on = anyio.Event()

    class StallingRunner(OperationRunner):
        async def _dispatch(self, d: Dispatch
                            ) -> dict[int, tuple[StepOutcome, str, Exception | None]]:
            if d.step == "update":
                paused.set()
                await go_on.wait()  # A freezes here (a GC pause, a partition, ...)
            return await super()._dispatch(d)

    async with client_for(address) as c:
        await c.wait_ready(timeout=10)
        a, b = StallingRunner(c), OperationRunner(c)
        results = {}

        async def run_a() -> None:
            results["a"] = await a.run(weight_update_plan(1, 0))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run_a)
            await paused.wait()
            results["b"] = await b.run(weight_update_plan(2, 0))  # the successor
            go_on.set()
        assert results["b"].ok and results["b"].fence > results["a"].fence
        stale = results["a"]
        assert stale.state is OperationState.SUPERSEDED, stale.summary()
        assert all(rep.applied == ("pause",) and rep.undone == () for rep in
                   stale.ranks.values())
        assert await info(c) == {r: (2, False) for r in range(N)}  # B's weights, running
        for n in (await counts(c)).values():
            assert n["fenced"] == 1
            assert n["runs"] == {"pause": 2, "update_weights": 1, "resume": 1}


async def test_serve_mode_engines_compensate_too(tmp_path: Path) -> None:
    """The same ledger on engines running an anyio event loop (--mode serve)."""
    os.chmod(tmp_path, 0o700)
    address = f"ipc://{tmp_path}/control.sock"
    with EngineFleet(N, lambda r: ["--connect", address, "--methods", METHODS,
                                   "--mode", "serve"]):
        async with client_for(address) as c:
            await c.wait_ready(timeout=10)
            runner = OperationRunner(c)
            await c.call("arm_fault", Fault("update_weights"), rank=2)
            result = await runner.run(weight_update_plan(1, 0))
            assert result.state is OperationState.ABORTED and result.failed_ranks == (2,)
            assert await info(c) == {r: (0, False) for r in range(N)}
            assert (await runner.run(weight_update_plan(1, 0))).ok
            assert await info(c) == {r: (1, False) for r in range(N)}
