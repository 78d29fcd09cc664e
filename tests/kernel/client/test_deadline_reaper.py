"""DeadlineReaper bookkeeping: rebuild cost with many live waits, finished items skipped;
and when each expiry fires, on the virtual clock.

Counts, not timings: a burst of thousands of queued tickets must not rebuild the
heap on every arm (it did when the threshold counted only live requests), the
heap stays bounded by the waits in progress, and the reaper does not sleep until
the deadline of an item it can see has already finished. On the virtual clock,
each wait ends at its own deadline and its caller is woken then, asserted within
a bounded virtual time (a missed wake-up fails an assertion, it does not hang).
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from ctlwire.kernel.client.deadline_reaper import DeadlineReaper
from ctlwire.kernel.core.admission_queue import AdmissionQueue, Ticket
from ctlwire.kernel.core.request_registry import RequestRegistry
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.errors import RequestTimedOut
from ctlwire.states import RequestState, TicketState
from ctlwire.testing import EngineHarness, virtual_backend

SLACK = DeadlineReaper.REBUILD_SLACK


def _reaper() -> DeadlineReaper:
    return DeadlineReaper(RequestRegistry(), wake=lambda entry: None)


def _queued(queue: AdmissionQueue, n: int) -> list[Ticket]:
    tickets = [queue.arrive() for _ in range(n)]
    assert all(t.state is TicketState.QUEUED for t in tickets[1:])
    return tickets


def test_many_live_queued_tickets_rebuild_rarely() -> None:
    # 3 x slack queued tickets, all live, no live request in the registry:
    # the old threshold (2 x live requests + slack) rebuilt on every arm past the slack
    reaper = _reaper()
    queue = AdmissionQueue("m")
    tickets = _queued(queue, 3 * SLACK)
    for i, ticket in enumerate(tickets[1:]):
        reaper.arm(ticket, 100.0 + i)
    assert reaper.armed == len(tickets) - 1  # nothing live dropped
    assert reaper.rebuilds <= 2


def test_rebuild_drops_finished_items_and_keeps_live_ones() -> None:
    reaper = _reaper()
    queue = AdmissionQueue("m")
    tickets = _queued(queue, 4 * SLACK)
    for i, ticket in enumerate(tickets[1:]):
        # later deadlines first: the finished items are never the top of the heap
        # (which the next arm would drop), only a rebuild drops them
        reaper.arm(ticket, 100.0 + 4 * SLACK - i)
        # the holder leaves as soon as the next one is armed: most armed tickets finish
        if i % 4 != 3:
            admitted = queue.leave(queue.holder) if queue.holder is not None else None
            assert admitted is not None
    live = sum(1 for t in tickets if t.state is TicketState.QUEUED)
    assert live > 0
    assert reaper.rebuilds >= 1
    # bounded by the waits in progress: twice what the last rebuild kept, plus slack
    assert reaper.armed <= 2 * live + SLACK + 2 * SLACK
    heap_items = [item for (_d, _s, item) in reaper._deadlines]
    assert all(t in heap_items for t in tickets if t.state is TicketState.QUEUED)


def test_finished_items_at_the_top_go_at_the_next_arm() -> None:
    """Sequential calls of one budget: each arm drops the calls already finished at
    the top of the heap, so neither they nor their entries (replies and all) stay
    in it until a rebuild."""
    registry = RequestRegistry()
    reaper = DeadlineReaper(registry, wake=lambda entry: None)
    for i in range(3 * SLACK):
        entry = registry.register("m", (0,), deadline=100.0 + i, timeout=30.0)
        registry.plan_sends(entry)
        registry.sent(entry, 0)
        reaper.arm(entry, 100.0 + i)
        assert reaper.armed == 1  # only this call's wait
        registry.release(entry)  # done (cancelled, then cleaned)
    assert reaper.rebuilds == 0
    # a live wait at the top keeps what finished behind it until a rebuild or its turn
    live = registry.register("m", (0,), deadline=50.0, timeout=30.0)
    registry.plan_sends(live)
    registry.sent(live, 0)
    reaper.arm(live, 50.0)
    for i in range(10):
        entry = registry.register("m", (0,), deadline=200.0 + i, timeout=30.0)
        registry.plan_sends(entry)
        registry.sent(entry, 0)
        reaper.arm(entry, 200.0 + i)
        registry.release(entry)
    # the live one and the ten behind it (the last finished one before it went
    # when it was armed)
    assert reaper.armed == 11
    assert reaper._deadlines[0][2] is live


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return virtual_backend(request.param)


@pytest.mark.anyio
async def test_reaper_sleeps_until_the_first_live_deadline() -> None:
    reaper = _reaper()
    queue = AdmissionQueue("m")
    holder, early, late = _queued(queue, 3)
    now = anyio.current_time()
    early.waiter = anyio.Event()
    late.waiter = anyio.Event()
    reaper.arm(early, now + 1.0)
    reaper.arm(late, now + 50.0)
    assert queue.leave(holder) is early  # early is admitted: its deadline is moot
    async with anyio.create_task_group() as tg:
        tg.start_soon(reaper.run, anyio.current_time)
        await anyio.sleep(0.5)
        assert reaper.scope is not None
        # not woken at early's deadline for nothing: it sleeps until late's
        assert reaper.scope.deadline == now + 50.0
        assert reaper.armed == 1
        await anyio.sleep(60.0)
        assert late.waiter.is_set()  # late still timed out in the queue, at its deadline
        assert late.state is TicketState.QUEUED
        tg.cancel_scope.cancel()
    assert reaper.scope is None


@pytest.mark.anyio
async def test_arming_an_earlier_deadline_wakes_the_sleeping_reaper_at_it() -> None:
    registry = RequestRegistry()
    woken: list[int] = []
    reaper = DeadlineReaper(registry, wake=lambda entry: woken.append(entry.id))
    now = anyio.current_time()
    late = registry.register("m", (0,), deadline=now + 50.0)
    reaper.arm(late, now + 50.0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(reaper.run, anyio.current_time)
        await anyio.sleep(0.5)  # the reaper sleeps until late's deadline
        early = registry.register("m", (0,), deadline=now + 1.0)
        reaper.arm(early, now + 1.0)
        await anyio.sleep(1.0)
        assert woken == [early.id]  # expired at its own deadline, not at late's
        assert not early.is_open and late.is_open
        await anyio.sleep(50.0)
        assert woken == [early.id, late.id]
        tg.cancel_scope.cancel()


def _hang_methods(ep: EngineEndpoint) -> None:
    async def hang() -> None:
        await anyio.sleep_forever()  # a handler that never answers

    ep.register("hang", hang)


@pytest.mark.anyio
async def test_a_shorter_call_made_after_a_longer_one_times_out_at_its_own_deadline() -> None:
    """Through the client: a 60 s call is waiting (the reaper sleeps until its
    deadline) when a 5 s call starts. The 5 s caller is woken with
    RequestTimedOut 5 s after it started, the 60 s one 60 s after it started.
    Everything runs inside a bounded virtual time, so a missed wake-up fails an
    assertion below instead of hanging the test."""
    ended: dict[str, tuple[str, float]] = {}  # caller -> (outcome, seconds it waited)

    async def caller(name: str, rank: int, timeout: float) -> None:
        start = anyio.current_time()
        try:
            await h.client.call("hang", rank=rank, timeout=timeout)
            outcome = "returned"
        except RequestTimedOut:
            outcome = "timed out"
        ended[name] = (outcome, anyio.current_time() - start)

    async with EngineHarness(ranks=2, setup=_hang_methods) as h:
        with anyio.move_on_after(100.0):  # virtual seconds: both deadlines lie within
            async with anyio.create_task_group() as tg:
                tg.start_soon(caller, "60 s", 0, 60.0)
                await anyio.sleep(1.0)  # it waits, and the reaper sleeps until its deadline
                tg.start_soon(caller, "5 s", 1, 5.0)
                await anyio.sleep(5.5)
                ended_by_6_5_s = list(ended)
        assert ended_by_6_5_s == ["5 s"], ended  # woken at its deadline, not at 60 s
        assert list(ended) == ["5 s", "60 s"], ended
        (outcome_5, waited_5), (outcome_60, waited_60) = ended["5 s"], ended["60 s"]
        assert outcome_5 == outcome_60 == "timed out"
        assert 5.0 <= waited_5 < 5.5 and 60.0 <= waited_60 < 60.5
        assert h.client.registry.live_count == 0
        stats = h.client.registry.stats
        assert stats.outcomes == {RequestState.TIMED_OUT: 2}
