"""An operation's progress events carry what each rank's step reports.

A step that calls ``report_progress(fraction, note)`` while it runs is heard
through the rank's heartbeats: the runner's ``on_progress`` gets one event per
new report, between the rank's Applying and Applied, with its fraction and note.
An exception raised by ``on_progress`` for a report ends the run like one raised
for a state change. A fan-out's ``on_progress`` hears its own request only.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from ctlwire.kernel import (
    EngineEndpoint,
    OperationLedger,
    OperationPlan,
    OperationRunner,
    OperationStep,
    ProgressEvent,
    report_progress,
)
from ctlwire.states import RankState

pytestmark = [pytest.mark.anyio, pytest.mark.ctlwire_virtual_clock]

SHARDS = 4


def setup(ep: EngineEndpoint) -> None:
    async def load(version: int) -> int:
        for i in range(1, SHARDS + 1):
            await anyio.sleep(20)  # reading one shard (virtual seconds)
            report_progress(i / SHARDS, f"shard {i}/{SHARDS} of v{version}")
        await anyio.sleep(20)
        return version

    OperationLedger({"load": load, "noop": lambda: None}).install(ep)

    @ep.method()
    async def slow(seconds: float) -> float:
        report_progress(0.5, f"rank {ep.rank}")
        await anyio.sleep(seconds)
        return seconds


PLAN = OperationPlan("weights", (OperationStep("pause", "noop"),
                                 OperationStep("load", "load", 7, timeout=600)))


async def test_each_ranks_reports_arrive_as_progress_events(ctlwire_harness: Any) -> None:
    async with ctlwire_harness(ranks=2, setup=setup) as h:
        seen: list[ProgressEvent] = []
        result = await OperationRunner(h.client).run(PLAN, on_progress=seen.append)
    assert result.ok
    for rank in (0, 1):
        events = [e for e in seen if e.rank == rank and e.step == "load"]
        reports = [(e.fraction, e.note) for e in events if e.fraction is not None]
        assert reports == [(i / SHARDS, f"shard {i}/{SHARDS} of v7")
                           for i in range(1, SHARDS + 1)], events
        # between the rank's Applying and Applied, its state unchanged
        kinds = [("report" if e.fraction is not None else e.state) for e in events]
        assert kinds == [RankState.APPLYING, *["report"] * SHARDS, RankState.APPLIED,
                         RankState.COMMITTED]
        assert all(e.state is RankState.APPLYING and e.phase == "apply"
                   for e in events if e.fraction is not None)
    # state changes carry no fraction
    assert all(e.fraction is None and e.note == "" for e in seen if e.step != "load")


class Stop(Exception):
    pass


async def test_an_exception_for_a_report_ends_the_run_like_a_controller_crash(
        ctlwire_harness: Any) -> None:
    def stop_at_half(event: ProgressEvent) -> None:
        if event.fraction is not None and event.fraction >= 0.5:
            raise Stop(event.note)

    async with ctlwire_harness(ranks=2, setup=setup) as h:
        runner = OperationRunner(h.client)
        with pytest.raises(Stop, match="shard 2/4"):
            await runner.run(PLAN, on_progress=stop_at_half)
        assert runner.progress() == {}  # not running, and left undecided
        recovery = await runner.recover(PLAN)
        assert recovery is not None and recovery.action != "done"


async def test_a_fan_outs_on_progress_hears_its_own_request_only(ctlwire_harness: Any
                                                                 ) -> None:
    heard: dict[str, list[int]] = {"a": [], "b": []}
    async with ctlwire_harness(ranks=2, setup=setup) as h, anyio.create_task_group() as tg:
        for name, rank in (("a", 0), ("b", 1)):
            tg.start_soon(lambda n=name, r=rank: h.client.fan_out(
                "slow", 60, ranks=[r], mode="concurrent", timeout=600,
                on_progress=lambda rank_heard, p, n=n: heard[n].append(rank_heard)))
    assert heard["a"] and set(heard["a"]) == {0}
    assert heard["b"] and set(heard["b"]) == {1}
