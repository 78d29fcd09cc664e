"""Fault-injecting transports: determinism, each fault kind, and the client's
guarantees under faults. In-memory transport, virtual time, both backends."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, Literal

import anyio
import msgspec
import pytest

from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.errors import ClientClosed, CtlwireError, EngineDead, RequestTimedOut
from ctlwire.states import PeerState
from ctlwire.testing import EngineHarness, virtual_backend
from ctlwire.testing.faults import (
    Fault,
    FaultInjector,
    FaultPlan,
    FaultyClientTransport,
    FaultyEngineTransport,
    Partition,
)
from ctlwire.transports.envelope import Heartbeat, Reply, Request
from ctlwire.transports.errors import TransportClosed
from ctlwire.transports.memory import MemoryNetwork
from ctlwire.transports.transport import ClientTransport, EngineTransport, Received

pytestmark = pytest.mark.anyio

INTERVAL = 0.25
MISSES = 4
# Lost after MISSES silent intervals; the last heartbeat may precede the fault by
# one interval and the liveness check runs once an interval: one more each.
LIVENESS_BOUND = INTERVAL * (MISSES + 2)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return virtual_backend(request.param)


class Engines:
    """Methods on every rank, plus a record of what each rank ran, in order."""

    def __init__(self) -> None:
        self.ran: dict[int, list[Any]] = {}

    def setup(self, ep: EngineEndpoint) -> None:
        ran = self.ran.setdefault(ep.rank, [])

        @ep.method()
        def echo(value: Any = None) -> Any:
            ran.append(value)
            return value

        @ep.method()
        async def nap(seconds: float) -> float:
            ran.append(seconds)
            await anyio.sleep(seconds)
            return seconds


def harness(plan: FaultPlan | None = None, *, ranks: int = 2, engines: Engines | None = None,
            engine_plan: Callable[[int], FaultPlan | None] | None = None,
            timeout: float = 2.0) -> tuple[EngineHarness, list[FaultyClientTransport],
                                           dict[int, FaultyEngineTransport]]:
    """An EngineHarness whose client (and optionally engine) transports inject faults."""
    wrapped: list[FaultyClientTransport] = []
    engine_wrappers: dict[int, FaultyEngineTransport] = {}

    def wrap_client(t: ClientTransport) -> ClientTransport:
        w = FaultyClientTransport(t, plan)
        wrapped.append(w)
        return w

    def wrap_engine(t: EngineTransport) -> EngineTransport:
        p = engine_plan(t.rank) if engine_plan is not None else None
        if p is None:
            return t
        w = engine_wrappers[t.rank] = FaultyEngineTransport(t, p)
        return w

    h = EngineHarness(ranks, (engines or Engines()).setup, wrap_client=wrap_client,
                      wrap_engine=wrap_engine,
                      client_kwargs={"default_timeout": timeout, "heartbeat_interval": INTERVAL,
                                     "heartbeat_misses": MISSES})
    return h, wrapped, engine_wrappers


def req(i: int, rank: int = 0) -> Request:
    return Request(i, rank, "echo", msgspec.Raw(b"\xc0"))


def assert_clean(h: EngineHarness) -> None:
    reg = h.client.registry
    reg.check_invariants()
    assert reg.live_count == 0
    assert reg.stats.registered == reg.stats.cleaned
    assert sum(reg.stats.outcomes.values()) == reg.stats.registered  # one outcome each


# -- the plan and the decision, without IO ------------------------------------------------


def test_fault_validation() -> None:
    with pytest.raises(ValueError):
        Fault.drop()  # neither a probability nor a count
    with pytest.raises(ValueError):
        Fault.drop(0.5, kinds={"token"})
    with pytest.raises(ValueError):
        Fault.delay(0.2, 0.1)
    with pytest.raises(ValueError):
        Fault.drop(1.5)
    assert Fault.drop(0.1, kinds=["reply"]).kinds == frozenset({"reply"})


def test_same_seed_same_injections_and_links_are_independent() -> None:
    plan = FaultPlan(seed=42, faults=(Fault.drop(0.1), Fault.duplicate(0.1),
                                      Fault.delay(0.0, 0.5, probability=0.2),
                                      Fault.reorder(0.05)))

    Link = tuple[Literal["send", "receive"], int]

    def run(order: list[Link], seed: int = 42) -> list[Any]:
        inj = FaultInjector(FaultPlan(seed=seed, faults=plan.faults))
        for i, (direction, rank) in enumerate(order):
            env = req(i, rank) if direction == "send" else Reply(i, rank, 1, True,
                                                                 msgspec.Raw(b"\xc0"))
            inj.decide(direction, rank, env)
        return sorted(x.key() for x in inj.log)

    links: list[Link] = [("send", 0), ("send", 1), ("receive", 0), ("receive", 1)]
    order = [links[i % 4] for i in range(4000)]
    first = run(order)
    assert first and first == run(order)
    assert run(order, seed=43) != first
    # another interleaving of the same links: each link's n-th frame has the same fate
    assert run(sorted(order)) == first


def test_every_nth_and_filters() -> None:
    inj = FaultInjector(FaultPlan(faults=(
        Fault.drop(every=10, direction="send", kinds={"request"}, ranks={2}),)))
    dropped = []
    for i in range(1, 51):
        if not inj.decide("send", 2, req(i, 2)).delays:
            dropped.append(i)
        assert inj.decide("send", 2, Heartbeat(-1, 1, i)).delays  # another kind
        assert inj.decide("send", 1, req(i, 1)).delays            # another rank
        assert inj.decide("receive", 2, Heartbeat(2, 1, i)).delays  # another direction
    assert dropped == [10, 20, 30, 40, 50]
    assert inj.counters["drop.send.request"] == 5 and inj.count("drop") == 5


def test_time_windows_and_partition_schedule() -> None:
    now = [0.0]
    inj = FaultInjector(FaultPlan(faults=(Fault.drop(1.0, start=1.0, end=2.0),),
                                  partitions=(Partition(3, start=5.0, end=6.0),)))
    inj.start(lambda: now[0])
    assert inj.decide("send", 0, req(1)).delays
    now[0] = 1.5
    assert not inj.decide("send", 0, req(2)).delays
    now[0] = 2.0
    assert inj.decide("send", 0, req(3)).delays
    now[0] = 5.5
    v = inj.decide("receive", 3, Heartbeat(3, 1, 1))
    assert v.partitioned and inj.partitioned == {3}
    inj.heal(3)  # by hand, ahead of the schedule
    assert inj.decide("receive", 3, Heartbeat(3, 1, 2)).delays and not inj.partitioned
    assert [e[1:] for e in inj.events] == [("heal", 3)]


# -- each fault kind, end to end ----------------------------------------------------------


async def test_dropped_request_times_out_and_nothing_leaks() -> None:
    plan = FaultPlan(faults=(Fault.drop(every=1, direction="send", kinds={"request"},
                                        ranks={0}),))
    h, (t,), _ = harness(plan)
    async with h:
        with pytest.raises(RequestTimedOut):
            await h.client.call("echo", 1, rank=0, timeout=0.5)
        assert await h.client.call("echo", 2, rank=1) == 2
        assert t.faults.counters["drop.send.request"] == 1
        assert h.client.peers.state(0) is PeerState.CONNECTED  # heartbeats still flow
        assert_clean(h)


async def test_duplicated_replies_are_counted_not_applied() -> None:
    plan = FaultPlan(faults=(Fault.duplicate(every=1, copies=2, direction="receive",
                                             kinds={"reply"}),))
    h, (t,), _ = harness(plan)
    async with h:
        for i in range(5):
            assert await h.client.call("echo", i, rank=i % 2) == i
        with anyio.fail_after(10):  # the copies behind the last reply are received too
            while h.client.registry.stats.duplicate < 10:
                await anyio.sleep(0.01)
        await anyio.sleep(0.05)  # and no more than those
        assert t.faults.counters["duplicate.receive.reply"] == 5
        assert h.client.registry.stats.duplicate == 10  # 2 extra copies of each reply
        assert_clean(h)


async def test_duplicated_requests_run_once() -> None:
    engines = Engines()
    plan = FaultPlan(faults=(Fault.duplicate(every=1, direction="send", kinds={"request"}),))
    h, _, _ = harness(plan, engines=engines)
    async with h:
        for i in range(4):
            assert await h.client.call("echo", i, rank=0) == i
        await anyio.sleep(0.01)
        assert engines.ran[0] == [0, 1, 2, 3]
        assert h.engines[0].counters["duplicates"] == 4
        assert_clean(h)


async def test_delay_then_late_reply_is_counted() -> None:
    plan = FaultPlan(faults=(Fault.delay(0.1, direction="receive", kinds={"reply"}),
                             Fault.delay(5.0, direction="receive", kinds={"reply"}, ranks={1})))
    h, (t,), _ = harness(plan)
    async with h:
        start = anyio.current_time()
        assert await h.client.call("echo", "slow", rank=0) == "slow"
        assert anyio.current_time() - start >= 0.1
        with pytest.raises(RequestTimedOut):
            await h.client.call("echo", "too slow", rank=1, timeout=1.0)
        await anyio.sleep(5.0)
        assert h.client.registry.stats.late == 1
        assert t.faults.counters["delay.receive.reply"] == 3  # rank 1's reply hit both rules
        assert t.pending_frames == 0
        assert_clean(h)


async def test_reorder_lets_the_next_frame_overtake() -> None:
    net = MemoryNetwork()
    plan = FaultPlan(faults=(Fault.reorder(every=2, kinds={"request", "reply"}, hold=0.05),))
    async with (FaultyClientTransport(net.client_transport(), plan) as client,
                net.engine_transport(0) as engine):
        for i in range(1, 7):  # request ids start at 1
            client.send_nowait(0, req(i))
        got = []
        for _ in range(5):
            event = engine.try_receive()
            assert isinstance(event, Received) and isinstance(event.envelope, Request)
            got.append(event.envelope.id)
        assert engine.try_receive() is None and client.pending_frames
        start = anyio.current_time()
        event = await engine.receive()  # 6 goes out when its hold expires
        assert anyio.current_time() - start == pytest.approx(0.05)
        assert isinstance(event, Received) and isinstance(event.envelope, Request)
        assert [*got, event.envelope.id] == [1, 3, 2, 5, 4, 6]
        # the receive side too
        for i in range(1, 5):
            engine.send_nowait(None, Reply(i, 0, 1, True, msgspec.Raw(b"\xc0")))
        ids = []
        for _ in range(4):
            event = await client.receive()
            assert isinstance(event, Received) and isinstance(event.envelope, Reply)
            ids.append(event.envelope.id)
        assert ids == [1, 3, 2, 4]
        assert client.faults.counters["reorder.send.request"] == 3
        assert client.faults.counters["reorder.receive.reply"] == 2


async def test_partition_is_a_silent_engine_then_heal_rejoins() -> None:
    h, (t,), _ = harness(FaultPlan(), timeout=30.0)
    async with h:
        got: dict[str, Any] = {}

        async def pending() -> None:
            with pytest.raises(EngineDead) as info:
                await h.client.call("nap", 10.0, rank=1)
            got["error"] = info.value
            got["at"] = anyio.current_time()

        engine_heartbeats = h.engines[1].counters["heartbeats_received"]
        async with anyio.create_task_group() as tg:
            tg.start_soon(pending)
            await anyio.sleep(0.1)
            start = anyio.current_time()
            t.partition(1)
        assert got["error"].rank == 1
        assert got["at"] - start <= LIVENESS_BOUND
        assert h.client.peers.state(1) is PeerState.LOST
        assert h.client.peers.state(0) is PeerState.CONNECTED
        # silent both ways: no heartbeat reached the engine, none came back
        assert h.engines[1].counters["heartbeats_received"] == engine_heartbeats
        assert t.faults.count("partition", "send", "heartbeat") > 0
        assert t.faults.count("partition", "receive", "heartbeat") > 0
        with pytest.raises(EngineDead):  # fails fast while lost
            await h.client.call("echo", 1, rank=1)
        t.heal(1)
        await h.client.wait_ready([1], timeout=1.0)
        assert await h.client.call("echo", "back", rank=1) == "back"
        assert h.client.peers.peers[1].rejoin_count == 1
        await anyio.sleep(10.0)  # the nap's reply is late: counted, not applied
        assert h.client.registry.stats.late == 1
        assert_clean(h)


async def test_scheduled_partition_and_notify() -> None:
    plan = FaultPlan(partitions=(Partition(1, start=1.0, end=3.0),
                                 Partition(0, start=4.0, end=5.0, notify=True)))
    h, (t,), _ = harness(plan)
    async with h:
        entered = anyio.current_time()  # the plan's clock started at about this point
        while h.client.peers.state(1) is not PeerState.LOST:
            await anyio.sleep(0.01)
        lost = anyio.current_time() - entered
        assert 1.0 < lost <= 1.0 + LIVENESS_BOUND
        while h.client.peers.state(1) is PeerState.LOST:
            await anyio.sleep(0.01)
        assert 3.0 <= anyio.current_time() - entered <= 3.0 + INTERVAL + 0.05
        await anyio.sleep(4.0 - (anyio.current_time() - entered) + 0.001)
        assert h.client.peers.state(0) is PeerState.LOST  # reported at once
        assert t.faults.counters["partition_notices"] == 1
        assert [e[1:] for e in t.faults.events] == [("partition", 1), ("heal", 1),
                                                    ("partition", 0)]
        await anyio.sleep(1.5)
        assert await h.client.call("echo", 0, rank=0) == 0
        assert_clean(h)


async def test_client_side_close() -> None:
    """The client's transport closes under it: pending calls still end (the
    ranks fall silent, so within the liveness bound), new calls fail at once."""
    h, (t,), _ = harness(FaultPlan(), timeout=30.0)
    async with h:
        outcome: list[BaseException] = []

        async def pending() -> None:
            try:
                await h.client.call("nap", 60.0, rank=0)
            except CtlwireError as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(pending)
            await anyio.sleep(0.1)
            closed_at = anyio.current_time()
            t.close()
        assert anyio.current_time() - closed_at <= LIVENESS_BOUND
        assert len(outcome) == 1 and isinstance(outcome[0], (ClientClosed, EngineDead))
        with pytest.raises((ClientClosed, EngineDead)):
            await h.client.call("echo", 1, rank=1)
        assert t.faults.counters["closed"] == 1
        assert_clean(h)


async def test_engine_side_faults_close_and_partition() -> None:
    def engine_plan(rank: int) -> FaultPlan | None:
        if rank == 0:
            return FaultPlan(close_at=2.0, faults=(Fault.drop(every=2, direction="send",
                                                              kinds={"reply"}),))
        return FaultPlan()

    h, _, engine_wrappers = harness(None, engine_plan=engine_plan, timeout=0.5)
    async with h:
        assert await h.client.call("echo", 1, rank=0) == 1
        with pytest.raises(RequestTimedOut):
            await h.client.call("echo", 2, rank=0)  # its reply was dropped by the engine
        assert engine_wrappers[0].faults.counters["drop.send.reply"] == 1
        # rank 0 closes at t=2: pending calls fail at once, not at the timeout
        with anyio.fail_after(3.0):
            while h.client.peers.state(0) is not PeerState.LOST:
                await anyio.sleep(0.01)
        assert engine_wrappers[0].closed and engine_wrappers[0].faults.counters["closed"] == 1
        # rank 1 partitions itself from the engine side
        engine_wrappers[1].partition()
        start = anyio.current_time()
        while h.client.peers.state(1) is not PeerState.LOST:
            await anyio.sleep(0.01)
        assert anyio.current_time() - start <= LIVENESS_BOUND
        engine_wrappers[1].heal()
        await h.client.wait_ready([1], timeout=1.0)
        assert await h.client.call("echo", 3, rank=1) == 3
        assert_clean(h)


async def test_engine_wrapper_synchronous_poll_with_delays() -> None:
    net = MemoryNetwork()
    now = [0.0]
    inj = FaultInjector(FaultPlan(faults=(Fault.delay(1.0, direction="receive",
                                                      kinds={"request"}),)))
    inj.start(lambda: now[0])
    engine = FaultyEngineTransport(net.engine_transport(0), inj)
    async with net.client_transport() as client:
        engine.open()
        client.send_nowait(0, req(7))
        assert engine.try_receive() is None  # held for 1 s of the injector's clock
        assert engine.pending_frames == 1
        now[0] = 1.0
        event = engine.try_receive()
        assert isinstance(event, Received) and event.envelope == req(7)
        engine.send_nowait(None, Reply(7, 0, 1, True, msgspec.Raw(b"\xc0")))
        got = await client.receive()
        assert isinstance(got, Received) and isinstance(got.envelope, Reply)
        engine.close()


# -- the client's guarantees under a mix of faults -----------------------------------------


@pytest.mark.parametrize("seed", [1, 2])
async def test_every_caller_gets_exactly_one_outcome_under_faults(seed: int) -> None:
    plan = FaultPlan(seed=seed, faults=(
        Fault.drop(0.03), Fault.duplicate(0.03), Fault.delay(0.0, 0.2, probability=0.1),
        Fault.reorder(0.05, hold=0.02)))
    h, (t,), _ = harness(plan, ranks=4, timeout=1.0)
    outcomes: Counter[str] = Counter()
    calls = 400
    async with h:
        async def caller(i: int) -> None:
            try:
                value = await h.client.call("echo", i, rank=i % 4)
            except CtlwireError as exc:  # EngineDead's refinements counted as EngineDead
                outcomes["EngineDead" if isinstance(exc, EngineDead) else type(exc).__name__] += 1
            else:
                assert value == i  # never someone else's answer
                outcomes["ok"] += 1

        async def partition_rank_3() -> None:
            await anyio.sleep(0.5)
            t.partition(3)
            await anyio.sleep(2.0)
            t.heal(3)

        async with anyio.create_task_group() as tg:
            tg.start_soon(partition_rank_3)
            for i in range(calls):
                tg.start_soon(caller, i)
                await anyio.sleep(0.01)
        await anyio.sleep(1.0)
        assert sum(outcomes.values()) == calls
        assert set(outcomes) <= {"ok", "RequestTimedOut", "EngineDead"}, outcomes
        assert outcomes["ok"] > calls / 2 and outcomes["EngineDead"] > 0
        assert t.faults.count("drop") and t.faults.count("duplicate")
        assert t.faults.count("delay") and t.faults.count("reorder")
        stats = h.client.registry.stats
        assert stats.duplicate > 0 and stats.unknown == 0 and stats.stray == 0
        await h.client.wait_ready(timeout=2.0)  # rank 3 rejoined
        assert_clean(h)


async def test_same_seed_same_run_end_to_end() -> None:
    async def run(seed: int) -> tuple[list[Any], list[str]]:
        plan = FaultPlan(seed=seed, faults=(Fault.drop(0.05), Fault.duplicate(0.05),
                                            Fault.delay(0.0, 0.1, probability=0.2)))
        h, (t,), _ = harness(plan, ranks=2, timeout=0.5)
        results: list[str] = []
        async with h:
            for i in range(60):
                try:
                    results.append(repr(await h.client.call("echo", i, rank=i % 2)))
                except CtlwireError as exc:
                    results.append(type(exc).__name__)
            assert_clean(h)
        return [x.key() for x in t.faults.log], results

    first = await run(5)
    assert first == await run(5)
    assert first != await run(6)


async def test_a_disconnection_loses_what_the_link_still_carried() -> None:
    """A heartbeat of a dead engine, delayed on the wire, must not resurrect it."""
    plan = FaultPlan(faults=(Fault.delay(0.1, direction="receive", ranks={1}),))
    h, (t,), _ = harness(plan)
    async with h:
        with anyio.fail_after(1.0):
            while not t.pending_frames:  # a heartbeat of rank 1 is on its way
                await anyio.sleep(0.01)
        h.stop_engine(1)
        await anyio.sleep(0.5)
        assert h.client.peers.state(1) is PeerState.LOST
        assert h.client.peers.peers[1].rejoin_count == 0
        assert h.client.counters["engine_lost"] == 1
        assert t.faults.count("lost", "receive", "heartbeat") >= 1
        assert_clean(h)


async def test_receive_many_takes_what_is_buffered_in_order_up_to_the_limit() -> None:
    net = MemoryNetwork()
    async with (FaultyClientTransport(net.client_transport(), FaultPlan()) as client,
                net.engine_transport(0) as engine):
        for i in range(1, 6):
            engine.send_nowait(None, Reply(i, 0, 1, True, msgspec.Raw(b"\xc0")))
        with anyio.fail_after(5):
            first = await client.receive_many(3)
            rest = await client.receive_many(3)
        ids = [e.envelope.id for e in first + rest if isinstance(e, Received)]
        assert (len(first), len(rest), ids) == (3, 2, [1, 2, 3, 4, 5])
        client.close()
        with pytest.raises(TransportClosed):
            await client.receive_many()
