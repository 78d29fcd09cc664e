"""Ordered pipelining of a queueing fan-out mailbox (``ControlClient(pipeline=...)``), in
virtual time over in-memory engines: up to k requests in flight, sent and received in
admission order, callers completed in admission order; what changes for a caller
when one of them is cancelled, times out, or a rank is lost with several in flight.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from ctlwire.kernel import ControlClient
from ctlwire.kernel.core.admission_queue import Ticket
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.errors import FanOutFailed, NotDelivered, OutcomeUnknown, RequestTimedOut
from ctlwire.testing import EngineHarness, virtual_backend
from ctlwire.transports.memory import MemoryNetwork

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return virtual_backend(request.param)


class Engines:
    """Each rank's ``work`` handler records the order requests arrive in and blocks
    each one until the test releases it (``concurrency=8``: every request in flight
    runs at once, so the test decides the order of the replies)."""

    def __init__(self) -> None:
        self.arrived: dict[int, list[Any]] = {}
        self.gates: dict[tuple[int, Any], anyio.Event] = {}
        self.next_rank = 0

    def setup(self, ep: EngineEndpoint) -> None:
        rank = self.next_rank
        self.next_rank += 1
        arrived = self.arrived.setdefault(rank, [])

        async def work(payload: Any = None) -> Any:
            arrived.append(payload)
            await self.gates.setdefault((rank, payload), anyio.Event()).wait()
            return payload

        ep.register("work", work, concurrency=8)

    def release(self, payload: Any, ranks: tuple[int, ...] = (0,)) -> None:
        for rank in ranks:
            self.gates.setdefault((rank, payload), anyio.Event()).set()


def admissions(client: ControlClient, method: str) -> list[int]:
    """The seq of every ticket of ``method``'s mailbox in admission order, as admitted."""
    order: list[int] = []

    def observe(t: Ticket, old: Any, event: Any, new: Any) -> None:
        if event.value == "admit":
            order.append(t.seq)

    client.mailbox(method).queue.observers.append(observe)
    return order


async def test_depth_three_sends_three_in_admission_order_and_completes_in_that_order(
        ) -> None:
    engines = Engines()
    async with EngineHarness(1, engines.setup, client_kwargs={"pipeline": {"work": 3}}) as h:
        c = h.client
        box = c.mailbox("work")
        assert box.pipeline_depth == 3 and c.mailbox("other").pipeline_depth == 1
        done: list[str] = []

        async def caller(name: str) -> None:
            res = await c.fan_out("work", name)
            assert res.results == {0: name}
            done.append(name)

        async with anyio.create_task_group() as tg:
            for name in "ABCDE":
                tg.start_soon(caller, name)
                await anyio.wait_all_tasks_blocked()  # arrival order A, B, C, D, E
            assert engines.arrived[0] == ["A", "B", "C"]  # three in flight, in order
            assert box.depth == 2 and box.queue.in_flight == 3
            engines.release("C")  # decided first: its slot goes to D, C waits for A, B
            await anyio.wait_all_tasks_blocked()
            assert engines.arrived[0] == ["A", "B", "C", "D"] and done == []
            engines.release("B")
            await anyio.wait_all_tasks_blocked()
            assert engines.arrived[0] == ["A", "B", "C", "D", "E"] and done == []
            engines.release("A")
            await anyio.wait_all_tasks_blocked()
            assert done == ["A", "B", "C"]
            engines.release("E")
            await anyio.wait_all_tasks_blocked()
            assert done == ["A", "B", "C"]  # E waits for D
            engines.release("D")
        assert done == ["A", "B", "C", "D", "E"]
        assert c.registry.live_count == 0 and not box.queue.busy and box.depth == 0


async def test_a_cancelled_caller_in_flight_leaves_at_once_and_the_others_keep_order() -> None:
    engines = Engines()
    async with EngineHarness(1, engines.setup, client_kwargs={"pipeline": {"work": 3}}) as h:
        c = h.client
        done: list[str] = []

        async def caller(name: str, scope: anyio.CancelScope | None = None) -> None:
            if scope is None:
                await c.fan_out("work", name)
                done.append(name)
                return
            with scope:
                await c.fan_out("work", name)
            done.append(f"{name} cancelled" if scope.cancelled_caught else name)

        scope_b = anyio.CancelScope()
        async with anyio.create_task_group() as tg:
            tg.start_soon(caller, "A")
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(caller, "B", scope_b)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(caller, "C")
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(caller, "D")
            await anyio.wait_all_tasks_blocked()
            assert engines.arrived[0] == ["A", "B", "C"]
            scope_b.cancel()  # B's request stays sent: the engine still runs it
            await anyio.wait_all_tasks_blocked()
            assert done == ["B cancelled"] and engines.arrived[0] == ["A", "B", "C", "D"]
            engines.release("C")
            engines.release("B")  # a late reply: dropped and counted
            await anyio.wait_all_tasks_blocked()
            assert done == ["B cancelled"]  # C waits for A
            engines.release("A")
            engines.release("D")
        assert done == ["B cancelled", "A", "C", "D"]
        assert c.registry.live_count == 0 and c.metrics()["replies_dropped"]["late"] == 1


async def test_an_earlier_caller_timing_out_releases_the_later_ones_in_order() -> None:
    engines = Engines()
    async with EngineHarness(1, engines.setup, client_kwargs={"pipeline": {"work": 3}}) as h:
        c = h.client
        done: list[str] = []

        async def caller(name: str, timeout: float) -> None:
            try:
                await c.fan_out("work", name, timeout=timeout)
                done.append(name)
            except RequestTimedOut:
                done.append(f"{name} timed out")

        async with anyio.create_task_group() as tg:
            tg.start_soon(caller, "A", 5.0)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(caller, "B", 60.0)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(caller, "C", 60.0)
            await anyio.wait_all_tasks_blocked()
            start = anyio.current_time()
            engines.release("B")
            engines.release("C")
            await anyio.wait_all_tasks_blocked()
            assert done == []  # decided, waiting for A
            while len(done) < 3:
                await anyio.sleep(0.1)
            assert 4.0 < anyio.current_time() - start < 6.0
            engines.release("A")
        assert done == ["A timed out", "B", "C"]
        assert c.registry.live_count == 0


async def test_a_rank_lost_with_three_in_flight_fails_each_in_order_queued_ones_unsent(
        ) -> None:
    """Two ranks, depth 3: rank 1 stops while A, B and C are in flight there and D is
    queued. A, B and C each get OutcomeUnknown for rank 1 (each may have run); D,
    sent after the loss, NotDelivered for it; rank 0's results complete each, in
    admission order."""
    engines = Engines()
    async with EngineHarness(2, engines.setup, client_kwargs={"pipeline": {"work": 3}}) as h:
        c = h.client
        outcomes: list[tuple[str, Any, Exception | None]] = []

        async def caller(name: str) -> None:
            try:
                res = await c.fan_out("work", name)
            except FanOutFailed as exc:
                res = exc.result
            outcomes.append((name, res.results.get(0), res.errors.get(1)))

        async with anyio.create_task_group() as tg:
            for name in "ABCD":
                tg.start_soon(caller, name)
                await anyio.wait_all_tasks_blocked()
            assert engines.arrived == {0: ["A", "B", "C"], 1: ["A", "B", "C"]}
            h.stop_engine(1)
            with anyio.fail_after(10):
                while c.peers.state(1).name != "LOST":
                    await anyio.sleep(0.1)
            for name in "ABCD":
                engines.release(name)
        assert [o[0] for o in outcomes] == ["A", "B", "C", "D"]
        assert [o[1] for o in outcomes] == ["A", "B", "C", "D"]
        assert [type(o[2]) for o in outcomes] == [OutcomeUnknown] * 3 + [NotDelivered]
        assert c.registry.live_count == 0


@pytest.mark.parametrize("depth", [0, -1, True, 1.5, "2", None])
async def test_a_pipeline_depth_must_be_an_int_of_at_least_one(depth: Any) -> None:
    with pytest.raises(ValueError, match=r"pipeline\['work'\] must be an int >= 1"):
        ControlClient(MemoryNetwork().client_transport(), ranks=1, pipeline={"work": depth})
    with pytest.raises(ValueError, match="non-empty string"):
        ControlClient(MemoryNetwork().client_transport(), ranks=1, pipeline={"": 2})


async def test_a_request_decided_while_sending_passes_its_slot_on_at_once() -> None:
    """Depth 2, rank 1 lost: A (rank 0) is in flight; B, addressed to rank 1 only,
    is decided by its send (NotDelivered) and so frees its slot before it returns:
    C is sent while A is still in flight, and the callers complete in order."""
    engines = Engines()
    async with EngineHarness(2, engines.setup, client_kwargs={"pipeline": {"work": 2}}) as h:
        c = h.client
        h.stop_engine(1)
        with anyio.fail_after(10):
            while c.peers.state(1).name != "LOST":
                await anyio.sleep(0.1)
        done: list[str] = []

        async def caller(name: str, rank: int) -> None:
            try:
                await c.fan_out("work", name, ranks=[rank])
                done.append(name)
            except FanOutFailed as exc:
                assert isinstance(exc.result.errors[rank], NotDelivered)
                done.append(f"{name} undelivered")

        async with anyio.create_task_group() as tg:
            for name, rank in (("A", 0), ("B", 1), ("C", 0)):
                tg.start_soon(caller, name, rank)
                await anyio.wait_all_tasks_blocked()
            assert engines.arrived[0] == ["A", "C"] and done == []
            engines.release("C")
            engines.release("A")
        assert done == ["A", "B undelivered", "C"]
        assert c.registry.live_count == 0
