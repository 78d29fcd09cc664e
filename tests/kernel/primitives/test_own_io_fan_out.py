"""A fan-out over the caller's own I/O (OwnIoFanOut), without a client, both backends."""

from __future__ import annotations

import math
from typing import Any

import anyio
import msgspec
import pytest

from ctlwire.kernel import (
    ClientClosed,
    OutcomeUnknown,
    OwnIoFanOut,
    RemoteError,
    RequestTimedOut,
)
from ctlwire.kernel.core.request_registry import PendingRequest, ReplyDisposition
from ctlwire.states import RequestEvent, RequestState
from ctlwire.testing import virtual_backend
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.envelope import ErrorInfo

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return virtual_backend(request.param)


class InProcessEngines:
    """``slots`` engines in this process: ``send`` runs them and hands their replies
    over at once, inside the send (no socket, nothing encoded)."""

    def __init__(self, slots: int) -> None:
        self.sent: list[Any] = []
        self.fan: OwnIoFanOut[Any] = OwnIoFanOut(self.send, slots)

    def send(self, request: Any) -> None:
        self.sent.append(request)
        for slot in range(self.fan.slots):
            self.fan.deliver({"slot": slot, "echo": request})


class Later:
    """Replies that the test hands over itself."""

    def __init__(self, slots: int, **kwargs: Any) -> None:
        self.sent: list[Any] = []
        self.fan: OwnIoFanOut[Any] = OwnIoFanOut(self.sent.append, slots, **kwargs)


async def test_an_in_process_engine_answers_inside_the_send_with_nothing_encoded() -> None:
    engines = InProcessEngines(3)
    payload = {"weights": [1, 2]}
    result = await engines.fan.call(payload)
    assert result.ok and sorted(result.results) == [0, 1, 2]
    assert all(v["echo"] is payload for v in result.results.values())  # not even copied
    assert result.joined is False and engines.sent == [payload]
    assert engines.fan.registry.live_count == 0 and engines.fan.in_flight is None


async def test_calls_go_out_in_arrival_order_each_sent_on_the_tick_it_is_admitted() -> None:
    later = Later(2)
    fan = later.fan
    results: dict[str, Any] = {}

    async def call(name: str) -> None:
        results[name] = await fan.call(name)

    async with anyio.create_task_group() as tg:
        for name in "ABCD":
            tg.start_soon(call, name)
            await anyio.wait_all_tasks_blocked()
        assert later.sent == ["A"] and fan.depth == 3
        for i, name in enumerate("ABCD"):
            fan.deliver(f"{name}0")
            assert later.sent == list("ABCD"[: i + 1])  # nothing else went out meanwhile
            fan.deliver(f"{name}1")  # the last slot: the next request goes out in this call
            assert later.sent == list("ABCD"[: i + 2])
    assert {n: r.results for n, r in results.items()} == {
        n: {0: f"{n}0", 1: f"{n}1"} for n in "ABCD"}


async def test_every_request_runs_through_the_request_state_machine() -> None:
    later = Later(1)
    seen: list[tuple[RequestState, RequestEvent, RequestState]] = []

    def observe(entry: PendingRequest, old: RequestState, event: RequestEvent,
                new: RequestState) -> None:
        seen.append((old, event, new))

    later.fan.registry.observers.append(observe)
    async with anyio.create_task_group() as tg:
        tg.start_soon(later.fan.call, "A")
        await anyio.wait_all_tasks_blocked()
        later.fan.deliver("a")
    s, e = RequestState, RequestEvent
    assert seen == [(s.REGISTERED, e.SEND, s.SENT), (s.SENT, e.WAIT, s.AWAITING),
                    (s.AWAITING, e.COMPLETE, s.DONE), (s.DONE, e.CLEAN, s.CLEANED)]


async def test_replies_that_name_their_slot_fill_it_in_any_order() -> None:
    later = Later(3, slot_of=lambda reply: reply[0])
    fan = later.fan
    async with anyio.create_task_group() as tg:
        results: list[Any] = []

        async def call() -> None:
            results.append(await fan.call("q"))

        tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        assert fan.deliver((2, "c")) is ReplyDisposition.ACCEPTED
        assert fan.deliver((7, "?")) is ReplyDisposition.STRAY
        assert fan.deliver((2, "again")) is ReplyDisposition.DUPLICATE
        fan.deliver((0, "a"))
        assert fan.deliver((1, "b")) is ReplyDisposition.COMPLETED
    assert results[0].results == {0: (0, "a"), 1: (1, "b"), 2: (2, "c")}
    assert fan.counters["stray"] == 1 and fan.registry.stats.duplicate == 1


async def test_with_a_codec_replies_are_decoded_as_the_result_type() -> None:
    class Info(msgspec.Struct):
        load: float

    codec = MsgpackCodec()
    later = Later(2, codec=codec, result_type=Info, mode="watching")
    fan = later.fan
    results: list[Any] = []

    async def call() -> None:
        results.append(await fan.call({"get": "info"}))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        assert len(later.sent) == 1  # identical requests (by their encoding) share
        for load in (0.5, 0.25):
            fan.deliver(msgspec.msgpack.encode({"load": load}))
    first, second = results
    assert first.results == second.results == {0: Info(0.5), 1: Info(0.25)}
    assert first.results[0] is not second.results[0]  # each caller decoded its own
    assert sorted([first.joined, second.joined]) == [False, True]


async def test_watchers_each_get_their_own_copy_and_the_last_the_original() -> None:
    later = Later(1, mode="watching", joins="any")
    fan = later.fan
    results: list[Any] = []
    value = {"nested": [1]}

    async def call(request: str) -> None:
        results.append((await fan.call(request)).results[0])

    async with anyio.create_task_group() as tg:
        for request in ("a", "b", "c"):
            tg.start_soon(call, request)
        await anyio.wait_all_tasks_blocked()
        assert len(later.sent) == 1
        fan.deliver(value)
    assert results == [value] * 3
    assert len({id(r) for r in results}) == 3 and sum(r is value for r in results) == 1


async def test_an_error_reply_is_typed_per_slot() -> None:
    later = Later(3)
    fan = later.fan
    async with anyio.create_task_group() as tg:
        results: list[Any] = []

        async def call() -> None:
            results.append(await fan.call("q"))

        tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        fan.deliver("ok")
        fan.deliver(None, error=ValueError("bad shape"))
        fan.deliver(None, error=ErrorInfo("Quota", "over", 7))
    (result,) = results
    assert result.results == {0: "ok"} and sorted(result.errors) == [1, 2]
    assert isinstance(result.errors[1], ValueError) and isinstance(result.errors[1], RemoteError)
    assert type(result.errors[2]) is RemoteError and result.errors[2].code == 7


async def test_a_deadline_while_queued_sends_nothing_and_says_so() -> None:
    later = Later(1)
    fan = later.fan
    outcomes: list[Any] = []

    async def call(name: str, timeout: float | None) -> None:
        try:
            outcomes.append((await fan.call(name, timeout=timeout)).results)
        except RequestTimedOut as exc:
            outcomes.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "A", None)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(call, "B", 1.0)
        await anyio.sleep(2.0)
        fan.deliver("a")
    assert isinstance(outcomes[0], RequestTimedOut) and outcomes[0].admission
    assert outcomes[1] == {0: "a"} and later.sent == ["A"]
    assert fan.queue.abandoned_total == 1 and fan.registry.live_count == 0


async def test_reset_gives_up_on_replies_that_never_come_and_sends_the_next() -> None:
    later = Later(2)
    fan = later.fan
    outcomes: dict[str, Any] = {}

    async def call(name: str) -> None:
        outcomes[name] = await fan.call(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "A")
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(call, "B")
        await anyio.wait_all_tasks_blocked()
        fan.deliver("a0")
        fan.reset()  # the engines restarted: a1 will never come
        assert later.sent == ["A", "B"] and fan.counters["reset"] == 1
        fan.deliver("b0")
        fan.deliver("b1")
    given_up, done = outcomes["A"], outcomes["B"]  # A: one slot answered, one given up
    assert given_up.results == {0: "a0"} and isinstance(given_up.errors[1], OutcomeUnknown)
    assert done.results == {0: "b0", 1: "b1"} and done.ok


async def test_a_reply_with_nothing_in_flight_is_dropped_and_counted() -> None:
    later = Later(1)
    assert later.fan.deliver("stray") is ReplyDisposition.UNKNOWN
    assert later.fan.counters["unexpected"] == 1


def test_built_without_a_loop_used_on_both_backends_then_closed() -> None:
    engines = InProcessEngines(2)  # a synchronous __init__: no loop runs
    expected = {slot: {"slot": slot, "echo": "x"} for slot in range(2)}

    async def use() -> Any:
        return (await engines.fan.call("x")).results

    async def use_then_close() -> Any:
        async with engines.fan:
            return await use()

    assert anyio.run(use, backend="asyncio") == expected
    assert anyio.run(use, backend="trio") == expected
    assert anyio.run(use_then_close, backend="asyncio") == expected
    assert engines.fan.closed
    with pytest.raises(ClientClosed):
        anyio.run(use, backend="trio")


async def test_close_ends_calls_in_flight_and_queued_with_client_closed() -> None:
    later = Later(1)
    fan = later.fan
    errors: list[BaseException] = []

    async def call(name: str) -> None:
        try:
            await fan.call(name)
        except ClientClosed as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for name in "AB":
            tg.start_soon(call, name)
            await anyio.wait_all_tasks_blocked()
        await fan.aclose()
    assert len(errors) == 2 and later.sent == ["A"]
    assert fan.deliver("late") is ReplyDisposition.UNKNOWN
    assert fan.registry.live_count == 0 and fan.depth == 0 and not fan.queue.busy


async def test_bad_arguments_are_refused_before_anything_is_registered() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            OwnIoFanOut(print, bad)
    with pytest.raises(ValueError):
        OwnIoFanOut(print, 1, mode="bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        OwnIoFanOut(print, 1, joins="some")  # type: ignore[arg-type]
    fan: OwnIoFanOut[Any] = OwnIoFanOut(print, 1, mode="watching")
    for timeout in (0, -1, math.nan):
        with pytest.raises(ValueError):
            await fan.call("x", timeout=timeout)
    with pytest.raises(TypeError):
        await fan.call(["unhashable"])  # identical watching needs key= for it
    assert fan.registry.stats.registered == 0
