"""The public FIFO admission gate, without a client, on both backends (virtual time)."""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest

from ctlwire.kernel import AdmissionGate, ClientClosed, RequestTimedOut
from ctlwire.kernel.core.admission_queue import Ticket
from ctlwire.states import TicketState
from ctlwire.testing import virtual_backend

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return virtual_backend(request.param)


class Owner:
    """Builds its gate in a synchronous ``__init__``: no event loop runs yet."""

    def __init__(self) -> None:
        self.gate = AdmissionGate("flush")
        self.order: list[str] = []
        self.inside = 0
        self.most_inside = 0

    async def flush(self, name: str, timeout: float | None = None) -> None:
        async with self.gate.admit(timeout=timeout):
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            self.order.append(name)
            await anyio.sleep(0.01)
            self.inside -= 1


OWNER = Owner()  # built at import, used by the one-at-a-time test below (first backend)


@pytest.mark.parametrize("holders", [1, 2])
async def test_a_lone_holder_leaves_its_block_at_once(holders: int) -> None:
    """Nobody was admitted before it: its turn to leave has come, whether or not it
    reported its start."""
    gate = AdmissionGate("g", holders=holders)
    for report_start in (False, True):
        with anyio.move_on_after(5) as scope:
            async with gate.admit() as ticket:
                if report_start:
                    gate.started(ticket)
        assert not scope.cancelled_caught, "the block did not end"
        assert not gate.busy and gate.queue.admitted() == []


@pytest.mark.parametrize("holders", [1, 2])
async def test_leaving_hands_the_slot_to_the_queued_caller_there_and_then(holders: int) -> None:
    """Every slot held and a caller queued: the holder that leaves (whether or not it
    started) admits the queued caller before that caller's task runs."""
    gate = AdmissionGate("g", holders=holders)
    held = []
    for _ in range(holders):
        ticket = await gate.enter()
        gate.started(ticket)
        held.append(ticket)
    entered: list[Ticket] = []

    async def queued() -> None:
        entered.append(await gate.enter())

    async with anyio.create_task_group() as tg:
        tg.start_soon(queued)
        await anyio.wait_all_tasks_blocked()
        assert gate.depth == 1 and gate.queue.in_flight == holders
        gate.leave(held[-1])
        assert gate.depth == 0 and gate.queue.in_flight == holders  # handed over
        await anyio.wait_all_tasks_blocked()
        assert len(entered) == 1 and entered[0].state is TicketState.ADMITTED
    for ticket in [*held[:-1], *entered]:
        gate.leave(ticket)
    assert not gate.busy and gate.queue.admitted() == []


async def test_a_gate_built_before_any_loop_admits_in_arrival_order_one_at_a_time() -> None:
    owner = OWNER if not OWNER.order else Owner()
    names = [f"c{i}" for i in range(50)]
    async with anyio.create_task_group() as tg:
        for name in names:
            tg.start_soon(owner.flush, name)
            await anyio.wait_all_tasks_blocked()  # arrival order = start order
    assert owner.order == names
    assert owner.most_inside == 1
    assert not owner.gate.busy and owner.gate.depth == 0
    assert owner.gate.queue.admitted_total == 50


async def test_a_caller_arriving_in_the_wakeup_window_queues_behind() -> None:
    """A holds, B queued; A leaves (B is handed the gate, its task has not run
    yet) and C arrives at once: B goes before C."""
    gate = AdmissionGate()
    order: list[str] = []

    async def caller(name: str) -> None:
        async with gate.admit():
            order.append(name)

    ticket_a = await gate.enter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(caller, "B")
        await anyio.wait_all_tasks_blocked()
        gate.leave(ticket_a)
        assert gate.busy and gate.depth == 0  # B holds it before its task runs
        tg.start_soon(caller, "C")  # the wake-up window: B has not run yet
    assert order == ["B", "C"]
    assert gate.queue.admitted_total == 3


async def test_a_cancelled_queued_caller_removes_only_its_own_turn() -> None:
    gate = AdmissionGate()
    order: list[str] = []
    scopes = {name: anyio.CancelScope() for name in "BCD"}

    async def caller(name: str) -> None:
        with scopes[name]:
            async with gate.admit():
                order.append(name)

    holder = await gate.enter()
    async with anyio.create_task_group() as tg:
        for name in "BCD":
            tg.start_soon(caller, name)
            await anyio.wait_all_tasks_blocked()
        scopes["C"].cancel()
        await anyio.wait_all_tasks_blocked()
        assert gate.depth == 2 and gate.queue.abandoned_total == 1
        gate.leave(holder)
    assert order == ["B", "D"]


async def test_a_caller_cancelled_after_the_hand_off_before_running_passes_it_on() -> None:
    gate = AdmissionGate()
    order: list[str] = []
    scope_b = anyio.CancelScope()

    async def caller(name: str, scope: anyio.CancelScope) -> None:
        with scope:
            async with gate.admit():
                order.append(name)

    holder = await gate.enter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(caller, "B", scope_b)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(caller, "C", anyio.CancelScope())
        await anyio.wait_all_tasks_blocked()
        gate.leave(holder)  # B is handed the gate...
        scope_b.cancel()  # ...and cancelled before its task runs again
    assert order == ["C"]
    assert not gate.busy and gate.queue.admitted_total == 3


async def test_an_exception_in_the_holder_passes_the_gate_on() -> None:
    gate = AdmissionGate()
    order: list[str] = []

    async def failing() -> None:
        try:
            async with gate.admit():
                await anyio.sleep(0.01)
                raise RuntimeError("holder fails")
        except RuntimeError:
            order.append("failed")

    async def caller() -> None:
        async with gate.admit():
            order.append("next")

    async with anyio.create_task_group() as tg:
        tg.start_soon(failing)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(caller)
        await anyio.wait_all_tasks_blocked()
        assert gate.depth == 1
    assert order == ["failed", "next"] and not gate.busy


async def test_the_deadline_bounds_the_whole_wait_and_only_that_callers() -> None:
    owner = Owner()  # each holder stays 10 ms
    failures: list[RequestTimedOut] = []

    async def impatient() -> None:
        try:
            await owner.flush("impatient", timeout=0.005)
        except RequestTimedOut as exc:
            failures.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(owner.flush, "first")
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(impatient)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(owner.flush, "last")
    assert owner.order == ["first", "last"]
    (exc,) = failures
    assert exc.admission and exc.method == "flush" and exc.timeout == 0.005
    assert owner.gate.queue.abandoned_total == 1


async def test_close_wakes_every_queued_caller_and_refuses_later_ones() -> None:
    gate = AdmissionGate("g")
    outcomes: list[str] = []

    async def caller() -> None:
        try:
            async with gate.admit():
                outcomes.append("admitted")
        except ClientClosed:
            outcomes.append("closed")

    holder = await gate.enter()
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(caller)
        await anyio.wait_all_tasks_blocked()
        gate.close()
    assert outcomes == ["closed"] * 3
    gate.leave(holder)
    with pytest.raises(ClientClosed):
        await gate.enter()
    assert not gate.busy and gate.depth == 0


async def test_a_bad_timeout_is_refused_before_arriving() -> None:
    gate = AdmissionGate()
    for bad in (0, -1.0, math.nan):
        with pytest.raises(ValueError):
            gate.admit(timeout=bad)
    with pytest.raises(TypeError):
        gate.admit(timeout="5")  # type: ignore[arg-type]
    assert gate.queue.admitted_total == 0 and gate.depth == 0


async def test_the_admitted_ticket_is_what_as_binds() -> None:
    gate = AdmissionGate()
    async with gate.admit() as ticket:
        assert isinstance(ticket, Ticket) and gate.queue.holder is ticket
    assert not gate.busy


async def test_two_holders_start_one_at_a_time_and_leave_in_arrival_order() -> None:
    """``holders=2``: a holder's first step (before ``started``) runs alone even when
    it awaits, at most two hold the gate, and blocks released in reverse order are
    left in arrival order."""
    gate = AdmissionGate("g", holders=2)
    started: list[str] = []
    left: list[str] = []
    inside = most = 0
    release = {name: anyio.Event() for name in "ABCD"}

    async def caller(name: str) -> None:
        nonlocal inside, most
        async with gate.admit() as ticket:
            inside += 1
            most = max(most, inside)
            await anyio.sleep(0.01)  # its first step awaits: nobody else is admitted
            assert gate.queue.in_flight - len(started) + len(left) == 1
            started.append(name)
            gate.started(ticket)
            await release[name].wait()
            inside -= 1
        left.append(name)

    async with anyio.create_task_group() as tg:
        for name in "ABCD":
            tg.start_soon(caller, name)
            await anyio.wait_all_tasks_blocked()
        await anyio.sleep(1)
        assert started == ["A", "B"] and gate.depth == 2
        release["B"].set()
        await anyio.sleep(1)
        assert left == [] and started == ["A", "B"]  # B waits for A, holding its slot
        release["A"].set()
        await anyio.sleep(1)
        assert left == ["A", "B"] and started == ["A", "B", "C", "D"]
        release["D"].set()
        release["C"].set()
    assert left == ["A", "B", "C", "D"] and most == 2
    assert not gate.busy and gate.depth == 0 and gate.holders == 2


async def test_close_wakes_a_holder_waiting_for_its_turn_to_leave() -> None:
    """``holders=2``: B's block ends while A still holds the gate; B waits for its
    turn until the gate closes, then leaves before A."""
    gate = AdmissionGate("g", holders=2)
    left: list[str] = []
    release_a = anyio.Event()

    async def caller(name: str, release: anyio.Event | None) -> None:
        async with gate.admit() as ticket:
            gate.started(ticket)
            if release is not None:
                await release.wait()
        left.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(caller, "A", release_a)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(caller, "B", None)
        await anyio.sleep(1)
        assert left == [] and gate.queue.in_flight == 2  # B waits for A
        gate.close()
        await anyio.sleep(1)
        assert left == ["B"]
        release_a.set()
    assert left == ["B", "A"] and not gate.busy


async def test_wait_turn_is_false_at_its_deadline_and_true_once_the_earlier_holder_left(
        ) -> None:
    gate = AdmissionGate("g", holders=2)
    first = await gate.enter()
    gate.started(first)
    second = await gate.enter()
    gate.started(second)
    start = anyio.current_time()
    assert await gate.wait_turn(second, start + 2.0) is False
    assert anyio.current_time() - start >= 2.0 and gate.queue.in_flight == 2
    assert await gate.wait_turn(first, start + 3.0) is True  # its turn at once
    turns: list[bool] = []

    async def wait_second() -> None:
        turns.append(await gate.wait_turn(second, anyio.current_time() + 10.0))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_second)
        await anyio.wait_all_tasks_blocked()
        assert turns == []
        gate.leave(first)  # hands the turn to second, which returns
        await anyio.wait_all_tasks_blocked()
        assert turns == [True]
    gate.leave(second)
    assert not gate.busy and gate.queue.admitted() == []
