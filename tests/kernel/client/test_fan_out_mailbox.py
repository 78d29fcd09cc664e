"""FIFO admission of the queueing fan-out mailbox (SGLang's bug), in virtual time."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from ctlwire.kernel.core.admission_queue import AdmissionQueue, Ticket
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.errors import FanOutFailed, RequestTimedOut
from ctlwire.states import TicketEvent, TicketState
from ctlwire.testing import EngineHarness, virtual_backend
from ctlwire.transports.envelope import Request
from ctlwire.transports.memory import MemoryClientTransport

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return virtual_backend(request.param)


class SendLog(MemoryClientTransport):
    """Records the payload of every request, in the order frames leave the client."""

    sent: list[Any]

    def send_nowait(self, rank: int, envelope: Any) -> None:
        if isinstance(envelope, Request):
            self.sent.append(self.codec.decode_value(envelope.payload))
        super().send_nowait(rank, envelope)


class Gated:
    """An engine method that blocks each call until the test opens it."""

    def __init__(self) -> None:
        self.waiting: list[tuple[Any, anyio.Event]] = []
        self.order: list[Any] = []

    def setup(self, ep: EngineEndpoint) -> None:
        async def work(payload: Any = None) -> Any:
            self.order.append(payload)
            ev = anyio.Event()
            self.waiting.append((payload, ev))
            await ev.wait()
            if payload == "raise":
                raise RuntimeError("holder fails")
            return payload

        ep.register("work", work)

        def instant(payload: Any = None) -> Any:
            self.order.append(payload)
            return payload

        ep.register("instant", instant)

    def release(self, payload: Any) -> None:
        for p, ev in self.waiting:
            if p == payload and not ev.is_set():
                ev.set()
                return
        raise AssertionError(f"{payload!r} is not waiting at the engine")


async def harness(gated: Gated, ranks: int = 1) -> EngineHarness:
    h = EngineHarness(ranks=ranks, setup=gated.setup)
    h.network._client.__class__ = SendLog  # type: ignore[union-attr]
    h.network._client.sent = []  # type: ignore[union-attr]
    return h


def trace_queue(queue: AdmissionQueue, log: list[tuple[str, int]]) -> None:
    """Log arrivals, admissions and resumptions of a mailbox's tickets."""
    real_arrive, real_resumed = queue.arrive, queue.resumed

    def arrive(waiter: Any = None) -> Ticket:
        t = real_arrive(waiter)
        log.append(("arrive", t.seq))
        return t

    def resumed(t: Ticket) -> None:
        log.append(("resumed", t.seq))
        real_resumed(t)

    def observer(t: Ticket, old: TicketState, ev: TicketEvent, new: TicketState) -> None:
        log.append((ev.value, t.seq))

    queue.arrive = arrive  # type: ignore[method-assign]
    queue.resumed = resumed  # type: ignore[method-assign]
    queue.observers.append(observer)


class SlowWake:
    """A ticket's waiter whose ``set`` (the hand-off) does not wake its task until
    the test says so: a scheduler slow to run the admitted caller."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.woken = False

    def set(self) -> None:
        self.woken = True

    def release(self) -> None:
        assert self.woken, "the ticket was never handed the mailbox"
        self.inner.set()


def slow_wake(queue: AdmissionQueue, seq: int) -> list[SlowWake]:
    """Give ticket ``seq`` a :class:`SlowWake` when it is handed the mailbox (the
    ticket a decision or a leaving holder admits, to be woken)."""
    slow: list[SlowWake] = []

    def intercept(real: Any) -> Any:
        def hand_off(t: Ticket) -> Ticket | None:
            nxt: Ticket | None = real(t)
            if nxt is not None and nxt.seq == seq and not slow:
                nxt.waiter = SlowWake(nxt.waiter)
                slow.append(nxt.waiter)
            return nxt
        return hand_off

    queue.decide = intercept(queue.decide)  # type: ignore[method-assign]
    queue.leave = intercept(queue.leave)  # type: ignore[method-assign]
    return slow


async def test_bug2_caller_in_wakeup_window_does_not_overtake() -> None:
    """A in flight, B queued, A's reply delivered (the mailbox is handed to B), C
    arrives before B's task runs again: all complete and the send order is
    exactly A, B, C."""
    gated = Gated()
    h = await harness(gated, ranks=2)
    async with h:
        c = h.client
        box = c.mailbox("work")
        log: list[tuple[str, int]] = []
        trace_queue(box.queue, log)
        slow_b = slow_wake(box.queue, 2)
        done: list[str] = []

        async def task_a() -> None:
            await c.fan_out("work", "A")
            done.append("A")
            # B holds the mailbox since A's decision but its task has not run yet:
            # C arrives inside B's wake-up window
            await c.fan_out("work", "C")
            done.append("C")

        async def task_b() -> None:
            await c.fan_out("work", "B")
            done.append("B")

        async with anyio.create_task_group() as tg:
            tg.start_soon(task_a)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(task_b)
            await anyio.wait_all_tasks_blocked()
            assert box.depth == 1
            gated.release("A")
            gated.release("A")
            await anyio.wait_all_tasks_blocked()
            assert ("arrive", 3) in log and ("resumed", 2) not in log
            slow_b[0].release()
            await anyio.wait_all_tasks_blocked()
            # C arrived (seq 3) before B (seq 2) resumed: the window was hit
            assert log.index(("arrive", 3)) < log.index(("resumed", 2))
            for name in ("B", "C"):
                gated.release(name)
                gated.release(name)
                await anyio.wait_all_tasks_blocked()
        assert h.network._client.sent == ["A", "A", "B", "B", "C", "C"]  # type: ignore[union-attr]
        assert sorted(done) == ["A", "B", "C"]
        admits = [seq for ev, seq in log if ev == "admit"]
        assert admits == [1, 2, 3]
        assert c.registry.live_count == 0 and box.depth == 0 and not box.queue.busy


async def test_the_decision_passes_the_mailbox_on_before_the_holder_runs_again() -> None:
    """A in flight, B queued: A's reply admits B (the hand-off is at the decision,
    not when A's task leaves), so B holds the mailbox by the time A's task reads
    its outcome, whichever of the two woken tasks runs first. Ten rounds: trio's
    order is random."""
    gated = Gated()
    async with await harness(gated) as h:
        c = h.client
        box = c.mailbox("work")
        sent: list[Any] = h.network._client.sent  # type: ignore[union-attr]
        seen: list[tuple[int | None, int, list[Any]]] = []
        issuer: Any = c.issuer
        real_outcome = issuer.outcomes.fan_out_outcome

        def fan_out_outcome(entry: Any, result_type: Any) -> Any:
            holder = box.queue.holder
            seen.append((None if holder is None else holder.seq, box.depth, list(sent)))
            return real_outcome(entry, result_type)

        issuer.outcomes.fan_out_outcome = fan_out_outcome
        for i in range(10):
            a, b = f"A{i}", f"B{i}"
            seen.clear()
            async with anyio.create_task_group() as tg:
                tg.start_soon(c.fan_out, "work", a)
                await anyio.wait_all_tasks_blocked()
                tg.start_soon(c.fan_out, "work", b)
                await anyio.wait_all_tasks_blocked()
                gated.release(a)
                await anyio.wait_all_tasks_blocked()
                gated.release(b)
            # when A read its outcome, B held the mailbox and nobody was queued
            assert seen[0][:2] == (2 * i + 2, 0), i
            assert sent[-2:] == [a, b]
            assert seen[1][:2] == (None, 0)  # B's decision: nobody left to hand to
        assert c.registry.live_count == 0 and not box.queue.busy


async def test_cancelled_queued_caller_keeps_order_of_the_rest() -> None:
    gated = Gated()
    async with await harness(gated) as h:
        c = h.client
        outcomes: dict[str, str] = {}
        scopes = {name: anyio.CancelScope() for name in "ABCD"}

        async def caller(name: str) -> None:
            with scopes[name]:
                await c.fan_out("work", name)
                outcomes[name] = "ok"
                return
            outcomes[name] = "cancelled"

        async with anyio.create_task_group() as tg:
            for name in "ABCD":
                tg.start_soon(caller, name)
                await anyio.wait_all_tasks_blocked()
            assert c.mailbox("work").depth == 3
            scopes["C"].cancel()
            await anyio.wait_all_tasks_blocked()
            assert c.mailbox("work").depth == 2
            for name in "ABD":
                gated.release(name)
                await anyio.wait_all_tasks_blocked()
        assert gated.order == ["A", "B", "D"]
        assert outcomes == {"A": "ok", "B": "ok", "C": "cancelled", "D": "ok"}
        assert c.registry.live_count == 0 and c.mailbox("work").depth == 0


async def test_caller_cancelled_after_handoff_before_resuming_passes_it_on() -> None:
    gated = Gated()
    async with await harness(gated) as h:
        c = h.client
        box = c.mailbox("work")
        scope_b = anyio.CancelScope()
        outcomes: list[str] = []

        async def b() -> None:
            with scope_b:
                await c.fan_out("work", "B")
            outcomes.append("B cancelled" if scope_b.cancelled_caught else "B ok")

        def on_admit(t: Ticket, old: TicketState, ev: TicketEvent, new: TicketState) -> None:
            if ev is TicketEvent.ADMIT and t.seq == 2:
                scope_b.cancel()  # B is admitted by hand-off, then cancelled before it runs

        box.queue.observers.append(on_admit)
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.fan_out, "work", "A")
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(b)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(c.fan_out, "work", "C")
            await anyio.wait_all_tasks_blocked()
            gated.release("A")
            await anyio.wait_all_tasks_blocked()
            gated.release("C")
        assert outcomes == ["B cancelled"]
        assert gated.order == ["A", "C"]
        assert not box.queue.busy and box.depth == 0 and c.registry.live_count == 0


async def test_holder_raising_does_not_block_the_queue() -> None:
    gated = Gated()
    async with await harness(gated) as h:
        c = h.client
        errors: list[BaseException] = []

        async def caller(payload: str) -> None:
            try:
                res = await c.fan_out("work", payload)
                res.raise_for_errors()
            except Exception as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for p in ("raise", "B"):
                tg.start_soon(caller, p)
                await anyio.wait_all_tasks_blocked()
            gated.release("raise")
            await anyio.wait_all_tasks_blocked()
            gated.release("B")
        assert gated.order == ["raise", "B"]
        assert len(errors) == 1 and "holder fails" in str(errors[0])
        assert c.registry.live_count == 0


async def test_holder_exception_in_caller_code_passes_the_mailbox_on() -> None:
    gated = Gated()
    async with await harness(gated) as h:
        c = h.client
        # a policy that cannot be met makes fan_out itself raise inside the holder
        h.stop_engine(0)
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(FanOutFailed):
            await c.fan_out("work", "A")
        await h.start_engine(0)
        await c.wait_ready()
        assert (await c.fan_out("instant", "B")).results == {0: "B"}
        assert c.mailbox("work").queue.holder is None


async def test_timeout_while_queued_counts_queue_time() -> None:
    gated = Gated()
    async with await harness(gated) as h:
        c = h.client
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: c.fan_out("work", "A", timeout=600.0))
            await anyio.wait_all_tasks_blocked()
            start = anyio.current_time()
            with pytest.raises(RequestTimedOut):
                await c.fan_out("work", "B", timeout=30.0)
            assert 30.0 <= anyio.current_time() - start < 31.0
            assert c.mailbox("work").depth == 0
            gated.release("A")
        assert gated.order == ["A"]
        assert c.registry.live_count == 0


async def test_a_thousand_concurrent_callers_keep_arrival_order() -> None:
    gated = Gated()
    async with await harness(gated) as h:
        c = h.client
        box = c.mailbox("instant")
        arrivals: list[int] = []
        real_arrive = box.queue.arrive

        def arrive(waiter: Any = None) -> Ticket:
            arrivals.append(current[0])
            return real_arrive(waiter)

        box.queue.arrive = arrive  # type: ignore[method-assign]
        current = [-1]
        results: dict[int, Any] = {}

        async def caller(i: int) -> None:
            current[0] = i
            results[i] = (await c.fan_out("instant", i)).results[0]

        async with anyio.create_task_group() as tg:
            for i in range(1000):
                tg.start_soon(caller, i)
        assert len(arrivals) == 1000 and sorted(arrivals) == list(range(1000))
        # the engine ran them in exactly the order they arrived at the mailbox
        assert gated.order == arrivals
        assert results == {i: i for i in range(1000)}
        assert box.queue.admitted_total == 1000
        assert c.registry.live_count == 0 and box.depth == 0


async def test_an_unknown_mode_is_refused_before_anything_is_registered_or_sent() -> None:
    gated = Gated()
    async with await harness(gated) as h:
        c = h.client
        with pytest.raises(ValueError, match="unknown mode 'fifo'"):
            await c.fan_out("instant", "A", mode="fifo")  # type: ignore[arg-type]
        assert h.network._client.sent == []  # type: ignore[union-attr]
        assert c.registry.stats.registered == 0 and gated.order == []
        assert (await c.fan_out("instant", "B", mode="concurrent")).results == {0: "B"}
