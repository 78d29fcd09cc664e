"""ctlwire.integrations.sglang.FanOutCommunicator behaves as SGLang's tests of its own
``FanOutCommunicator`` require (release 0.5.23's interface, the cancellation cases of
SGLang's main branch), on both anyio backends: the A/B/C wake-up window, queueing,
watching, the constructor, result merging, and every cancellation point."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from ctlwire.integrations.sglang import SGLANG_INTERFACE, FanOutCommunicator, UnknownMode
from ctlwire.kernel import ClientClosed, OutcomeUnknown, RequestTimedOut

pytestmark = pytest.mark.anyio


class Caller:
    """One caller's task: its own cancel scope and what it got."""

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = anyio.Event()

    async def run(self, call: Callable[[], Any]) -> None:
        with self.scope:
            try:
                self.result = await call()
            except Exception as exc:
                self.error = exc
        self.done.set()

    @property
    def cancelled(self) -> bool:
        return self.scope.cancelled_caught


async def start(tg: anyio.abc.TaskGroup, call: Callable[[], Any]) -> Caller:
    caller = Caller()
    tg.start_soon(caller.run, call)
    await anyio.wait_all_tasks_blocked()
    return caller


async def cancel(caller: Caller) -> None:
    caller.scope.cancel()
    await caller.done.wait()


def replying(comm: FanOutCommunicator[str], replies: Callable[[str], list[str]],
             tg: anyio.abc.TaskGroup) -> list[str]:
    """A ``send`` whose schedulers answer one scheduling step later, as a socket does."""
    sent: list[str] = []

    def send(obj: str) -> None:
        sent.append(obj)

        async def answer() -> None:
            await anyio.sleep(0)
            for reply in replies(obj):
                comm.handle_recv(reply)

        tg.start_soon(answer)

    comm._send = send
    return sent


def test_the_interface_followed_is_named() -> None:
    assert SGLANG_INTERFACE == "0.5.23"


# -- queueing: the wake-up window and FIFO ---------------------------------------------------


async def test_a_caller_in_the_wakeup_window_cannot_overtake_a_queued_one() -> None:
    """A in flight, B queued; A's reply arrives and C is created before B runs:
    the sends are A, B, C and every caller completes."""
    sent: list[str] = []
    comm: FanOutCommunicator[str] = FanOutCommunicator(send=sent.append, fan_out=1)
    async with anyio.create_task_group() as tg:
        a = await start(tg, lambda: comm("A"))
        b = await start(tg, lambda: comm("B"))
        comm.handle_recv("reply-A")  # B's request goes out now, in this very call
        assert sent == ["A", "B"]
        c = Caller()
        tg.start_soon(c.run, lambda: comm("C"))  # before B's task runs again
        await anyio.wait_all_tasks_blocked()
        assert sent == ["A", "B"] and comm.fan_out.depth == 1  # C waits behind B
        for _ in range(100):  # answer whatever is in flight, as SGLang's test does
            if all(x.done.is_set() for x in (a, b, c)):
                break
            event = comm._result_event
            if event is not None and not event.is_set():
                comm.handle_recv(f"reply-{len(sent)}")
            await anyio.sleep(0)
    assert sent == ["A", "B", "C"]
    assert (a.result, b.result, c.result) == (["reply-A"], ["reply-2"], ["reply-3"])
    assert comm._result_event is None


async def test_one_call_sends_once_and_returns_every_schedulers_reply_in_order() -> None:
    comm: FanOutCommunicator[str] = FanOutCommunicator(send=None, fan_out=2, mode="queueing")
    async with anyio.create_task_group() as tg:
        sent = replying(comm, lambda obj: [f"{obj}-0", f"{obj}-1"], tg)
        assert await comm.queueing_call("req") == ["req-0", "req-1"]
    assert sent == ["req"]


async def test_concurrent_queueing_callers_go_out_one_at_a_time_in_arrival_order() -> None:
    comm: FanOutCommunicator[str] = FanOutCommunicator(send=None, fan_out=1)
    results: dict[str, list[str]] = {}

    async def call(obj: str) -> None:
        results[obj] = await comm.queueing_call(obj)

    async with anyio.create_task_group() as tg:
        sent = replying(comm, lambda obj: [f"reply-{obj}"], tg)
        for obj in "abcde":
            tg.start_soon(call, obj)
            await anyio.wait_all_tasks_blocked()
    assert sent == list("abcde")
    assert results == {obj: [f"reply-{obj}"] for obj in "abcde"}


# -- watching ------------------------------------------------------------------------------


async def test_concurrent_watchers_share_the_first_callers_request() -> None:
    comm: FanOutCommunicator[str] = FanOutCommunicator(send=None, fan_out=1, mode="watching")
    results: list[list[str]] = []

    async def call(obj: str) -> None:
        results.append(await comm.watching_call(obj))

    async with anyio.create_task_group() as tg:
        sent = replying(comm, lambda obj: ["shared"], tg)
        tg.start_soon(call, "first")
        tg.start_soon(call, "second")
    assert len(sent) == 1  # whichever started first; the other joined
    assert results == [["shared"], ["shared"]]
    assert results[0] is not results[1]  # each caller its own copy


async def test_a_watcher_after_the_answer_sends_a_request_of_its_own() -> None:
    comm: FanOutCommunicator[str] = FanOutCommunicator(send=None, fan_out=1, mode="watching")
    async with anyio.create_task_group() as tg:
        sent = replying(comm, lambda obj: [f"answer-{len(sent)}"], tg)
        assert await comm.watching_call("req") == ["answer-1"]
        assert await comm.watching_call("req") == ["answer-2"]
    assert sent == ["req", "req"]


async def test_a_cancelled_watcher_does_not_take_the_answer_from_the_others() -> None:
    sent: list[str] = []
    comm: FanOutCommunicator[str] = FanOutCommunicator(sent.append, 2, mode="watching")
    async with anyio.create_task_group() as tg:
        first = await start(tg, lambda: comm("A"))
        second = await start(tg, lambda: comm("B"))
        comm.handle_recv("A-0")
        await cancel(first)
        comm.handle_recv("A-1")
    assert first.cancelled and second.result == ["A-0", "A-1"]
    assert sent == ["A"]


# -- the constructor and merging -----------------------------------------------------------


def test_an_unknown_mode_is_refused_as_sglang_does_and_as_a_value_error() -> None:
    for mode in ("bogus", "Queueing", ""):
        with pytest.raises(AssertionError):
            FanOutCommunicator(send=lambda obj: None, fan_out=1, mode=mode)
        with pytest.raises(ValueError):
            FanOutCommunicator(send=lambda obj: None, fan_out=1, mode=mode)
    assert issubclass(UnknownMode, ValueError) and issubclass(UnknownMode, AssertionError)
    with pytest.raises(ValueError, match="slots"):
        FanOutCommunicator(send=lambda obj: None, fan_out=0)


class Outcome:
    def __init__(self, success: bool, message: str) -> None:
        self.success = success
        self.message = message


def test_merge_results_is_all_success_and_the_messages_joined() -> None:
    assert FanOutCommunicator.merge_results([Outcome(True, "a"), Outcome(True, "b")]) == (
        True, "a | b")
    assert FanOutCommunicator.merge_results([Outcome(True, "a"), Outcome(False, "x")]) == (
        False, "a | x")
    assert FanOutCommunicator.merge_results([]) == (True, "")


# -- cancellation at every point -----------------------------------------------------------


@pytest.mark.parametrize("fan_out", [1, 2, 4])
async def test_a_cancelled_call_is_drained_before_the_next_request_goes_out(
        fan_out: int) -> None:
    """Its late replies are counted late, never taken for the next request's."""
    sent: list[str] = []
    comm: FanOutCommunicator[str] = FanOutCommunicator(sent.append, fan_out)
    async with anyio.create_task_group() as tg:
        first = await start(tg, lambda: comm("A"))
        for rank in range(fan_out - 1):
            comm.handle_recv(f"A-{rank}")
        await cancel(first)
        second = await start(tg, lambda: comm("B"))
        assert sent == ["A"]
        comm.handle_recv(f"A-{fan_out - 1}")  # the last of A's: B goes out now
        assert sent == ["A", "B"]
        for rank in range(fan_out):
            comm.handle_recv(f"B-{rank}")
    assert first.cancelled and second.result == [f"B-{rank}" for rank in range(fan_out)]
    assert comm.counters["late"] == 1  # A's last reply, after A was cleaned


async def test_a_cancelled_queued_call_is_never_sent() -> None:
    sent: list[str] = []
    comm: FanOutCommunicator[str] = FanOutCommunicator(sent.append, 1)
    async with anyio.create_task_group() as tg:
        first = await start(tg, lambda: comm("A"))
        queued = await start(tg, lambda: comm("B"))
        last = await start(tg, lambda: comm("C"))
        await cancel(queued)
        comm.handle_recv("A-result")
        assert sent == ["A", "C"]
        comm.handle_recv("C-result")
    assert (first.result, last.result) == (["A-result"], ["C-result"])
    assert queued.cancelled and comm.fan_out.queue.abandoned_total == 1


async def test_a_call_cancelled_after_its_last_reply_frees_the_fan_out() -> None:
    sent: list[str] = []
    comm: FanOutCommunicator[str] = FanOutCommunicator(sent.append, 1)
    async with anyio.create_task_group() as tg:
        first = await start(tg, lambda: comm("A"))
        comm.handle_recv("A-result")
        await cancel(first)  # before it ran again: its result is lost, nothing else
        second = await start(tg, lambda: comm("B"))
        assert sent == ["A", "B"]
        comm.handle_recv("B-result")
    assert second.result == ["B-result"] and comm._result_event is None


async def test_a_send_that_raises_fails_its_own_call_only() -> None:
    sent: list[str] = []

    def send(obj: str) -> None:
        if obj == "A":
            raise RuntimeError("send failed")
        sent.append(obj)

    comm: FanOutCommunicator[str] = FanOutCommunicator(send, 1)
    with pytest.raises(RuntimeError, match="send failed"):
        await comm("A")
    async with anyio.create_task_group() as tg:
        second = await start(tg, lambda: comm("B"))
        assert sent == ["B"]
        comm.handle_recv("B-result")
    assert second.result == ["B-result"]


async def test_a_send_that_raises_for_a_queued_call_fails_it_and_sends_the_next() -> None:
    sent: list[str] = []

    def send(obj: str) -> None:
        if obj == "B":
            raise RuntimeError("B cannot go")
        sent.append(obj)

    comm: FanOutCommunicator[str] = FanOutCommunicator(send, 1)
    async with anyio.create_task_group() as tg:
        a = await start(tg, lambda: comm("A"))
        b = await start(tg, lambda: comm("B"))
        c = await start(tg, lambda: comm("C"))
        comm.handle_recv("A-result")  # B's send raises here: C goes out instead
        assert sent == ["A", "C"]
        comm.handle_recv("C-result")
    assert a.result == ["A-result"] and c.result == ["C-result"]
    assert isinstance(b.error, RuntimeError) and str(b.error) == "B cannot go"


async def test_a_fan_out_change_does_not_shorten_a_cancelled_call() -> None:
    sent: list[str] = []
    comm: FanOutCommunicator[str] = FanOutCommunicator(sent.append, 2)
    async with anyio.create_task_group() as tg:
        first = await start(tg, lambda: comm("A"))
        await cancel(first)
        comm.set_fan_out(1)
        second = await start(tg, lambda: comm("B"))
        comm.handle_recv("A-0")
        assert sent == ["A"]
        comm.handle_recv("A-1")
        assert sent == ["A", "B"]
        comm.handle_recv("B-0")
    assert second.result == ["B-0"]


# -- what the swap adds ----------------------------------------------------------------------


def test_it_is_built_without_an_event_loop_and_serves_two_loops_in_turn() -> None:
    """SGLang builds its communicators in a synchronous __init__."""
    sent: list[str] = []
    comm: FanOutCommunicator[str] = FanOutCommunicator(sent.append, 1)

    async def one_call(obj: str) -> list[str]:
        async with anyio.create_task_group() as tg:
            caller = await start(tg, lambda: comm(obj))
            comm.handle_recv(f"{obj}-result")
        return caller.result  # type: ignore[no-any-return]

    assert anyio.run(one_call, "A", backend="asyncio") == ["A-result"]
    assert anyio.run(one_call, "B", backend="trio") == ["B-result"]
    assert sent == ["A", "B"]


async def test_a_timeout_bounds_a_call_and_its_replies_are_still_drained() -> None:
    sent: list[str] = []
    comm: FanOutCommunicator[str] = FanOutCommunicator(sent.append, 2, timeout=0.05)
    async with anyio.create_task_group() as tg:
        first = await start(tg, lambda: comm("A"))
        comm.handle_recv("A-0")
        await first.done.wait()
    timed_out = first.error
    assert isinstance(timed_out, RequestTimedOut) and not timed_out.admission
    assert timed_out.partial is not None and timed_out.partial.results == {0: "A-0"}
    async with anyio.create_task_group() as tg:
        second = await start(tg, lambda: comm("B"))
        assert sent == ["A"]  # A's second reply is still due
        comm.handle_recv("A-1")
        comm.handle_recv("B-0")
        comm.handle_recv("B-1")
    assert second.result == ["B-0", "B-1"]


async def test_replies_nobody_waits_for_are_counted_and_close_ends_every_call() -> None:
    sent: list[str] = []
    comm: FanOutCommunicator[str] = FanOutCommunicator(sent.append, 1)
    comm.handle_recv("stray")
    assert comm.counters["unexpected"] == 1
    async with anyio.create_task_group() as tg:
        first = await start(tg, lambda: comm("A"))
        queued = await start(tg, lambda: comm("B"))
        comm.close()
    assert isinstance(first.error, ClientClosed) and isinstance(queued.error, ClientClosed)
    assert sent == ["A"]
    with pytest.raises(ClientClosed):
        await comm("C")
    assert comm.fan_out.registry.live_count == 0 and comm.fan_out.depth == 0


async def test_replies_given_up_on_fail_the_call_and_the_next_request_goes_out() -> None:
    sent: list[str] = []
    comm: FanOutCommunicator[str] = FanOutCommunicator(sent.append, 2)
    async with anyio.create_task_group() as tg:
        first = await start(tg, lambda: comm("A"))
        second = await start(tg, lambda: comm("B"))
        comm.handle_recv("A-0")
        comm.fan_out.reset()  # the schedulers restarted: A-1 never comes
        assert sent == ["A", "B"]
        comm.handle_recv("B-0")
        comm.handle_recv("B-1")
    assert isinstance(first.error, OutcomeUnknown) and second.result == ["B-0", "B-1"]
