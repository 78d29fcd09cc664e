"""The public watching coalescer, without a client (both backends), and a client's
watching fan-outs in both join modes."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from ctlwire.kernel import Coalescer, FanOutFailed, NotDelivered, RequestTimedOut, SharedOutcome
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.testing import EngineHarness, virtual_backend

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return virtual_backend(request.param)


class InfoClient:
    """Callers of ``info(key)`` share one request in flight; ``answer`` is the
    receive loop's side. Built synchronously."""

    def __init__(self, joins: Any = "identical") -> None:
        self.flights: Coalescer[SharedOutcome[dict[str, Any]]] = Coalescer(joins)
        self.sent: list[str] = []
        self.started: list[bool] = []

    async def info(self, key: str, timeout: float | None = None) -> dict[str, Any]:
        flight, started = self.flights.share(key, SharedOutcome)
        self.started.append(started)
        if started:
            self.sent.append(key)
        try:
            return await flight.wait(timeout=timeout)
        finally:
            self.flights.done(key, flight)

    def answer(self, key: str, value: dict[str, Any]) -> None:
        flight = self.flights.get(key)
        assert flight is not None, f"nothing in flight for {key!r}"
        flight.set_result(value)


async def test_identical_callers_share_one_request_and_each_gets_its_own_copy() -> None:
    client = InfoClient()
    results: list[dict[str, Any]] = []

    async def call(key: str) -> None:
        results.append(await client.info(key))

    async with anyio.create_task_group() as tg:
        for key in ("a", "a", "a", "b"):
            tg.start_soon(call, key)
        await anyio.wait_all_tasks_blocked()
        assert sorted(client.sent) == ["a", "b"]
        assert client.flights.in_flight == 2
        client.answer("a", {"v": [1]})
        client.answer("b", {"v": [2]})
    assert sorted(client.started) == [False, False, True, True]
    assert client.flights.joined_total == 2 and client.flights.started_total == 2
    a_results = [r for r in results if r == {"v": [1]}]
    assert len(a_results) == 3
    a_results[0]["v"].append("mine")  # a copy each: the others do not see it
    assert a_results[1] == a_results[2] == {"v": [1]}
    assert client.flights.in_flight == 0


async def test_with_any_every_concurrent_caller_joins_the_flight_in_progress() -> None:
    client = InfoClient(joins="any")
    results: list[dict[str, Any]] = []

    async def call(key: str) -> None:
        results.append(await client.info(key))

    async with anyio.create_task_group() as tg:
        for key in ("a", "b", "c"):
            tg.start_soon(call, key)
            await anyio.wait_all_tasks_blocked()
        assert client.sent == ["a"] and client.started == [True, False, False]
        client.answer("a", {"v": 1})
    assert results == [{"v": 1}] * 3


async def test_the_starter_leaving_does_not_take_the_answer_from_the_others() -> None:
    client = InfoClient(joins="any")
    results: list[Any] = []
    starter = anyio.CancelScope()

    async def call(key: str, scope: anyio.CancelScope) -> None:
        with scope:
            results.append(await client.info(key))
            return
        results.append("cancelled")

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "a", starter)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(call, "b", anyio.CancelScope())
        await anyio.wait_all_tasks_blocked()
        starter.cancel()
        await anyio.wait_all_tasks_blocked()
        assert results == ["cancelled"] and client.flights.in_flight == 1
        client.answer("a", {"v": 1})
    assert results == ["cancelled", {"v": 1}]
    assert client.sent == ["a"]


async def test_a_joiner_timing_out_leaves_alone_and_a_decided_flight_is_not_joined() -> None:
    client = InfoClient()
    results: list[Any] = []

    async def call(timeout: float | None) -> None:
        try:
            results.append(await client.info("a", timeout))
        except RequestTimedOut:
            results.append("timed out")

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, None)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(call, 0.01)
        await anyio.sleep(0.02)
        assert results == ["timed out"] and client.flights.in_flight == 1
        client.answer("a", {"v": 1})
    assert results == ["timed out", {"v": 1}]
    # decided and left: the next caller starts a request of its own
    async with anyio.create_task_group() as tg:
        tg.start_soon(call, None)
        await anyio.wait_all_tasks_blocked()
        assert client.sent == ["a", "a"]
        client.answer("a", {"v": 2})
    assert results[-1] == {"v": 2}


async def test_an_exception_reaches_every_caller_and_unknown_modes_are_refused() -> None:
    client = InfoClient()
    errors: list[BaseException] = []

    async def call() -> None:
        try:
            await client.info("a")
        except LookupError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        flight = client.flights.get("a")
        assert flight is not None and flight.set_exception(LookupError("gone"))
        assert not flight.set_result({})  # decided once
    assert [str(e) for e in errors] == ["gone", "gone"]
    with pytest.raises(ValueError, match="joins"):
        Coalescer("some")  # type: ignore[arg-type]


# -- a client's watching fan-outs -------------------------------------------------------


def _gated(ep: EngineEndpoint, gate: list[anyio.Event], calls: list[Any]) -> None:
    async def load(payload: Any = None) -> Any:
        calls.append(payload)
        await gate[0].wait()
        return {"load": payload}

    ep.register("load", load, read_only=True)


@pytest.mark.parametrize("joins", ["identical", "any"])
async def test_a_clients_watching_fan_out_joins_by_mode_and_says_who_joined(
        joins: str) -> None:
    gate: list[anyio.Event] = []
    calls: list[Any] = []
    async with EngineHarness(ranks=2, setup=lambda ep: _gated(ep, gate, calls)) as h:
        gate.append(anyio.Event())
        results: dict[str, Any] = {}

        async def call(name: str, payload: str) -> None:
            results[name] = await h.client.fan_out("load", payload, mode="watching",
                                                   joins=joins)  # type: ignore[arg-type]

        async with anyio.create_task_group() as tg:
            for name, payload in (("first", "x"), ("same", "x"), ("other", "y")):
                tg.start_soon(call, name, payload)
                await anyio.wait_all_tasks_blocked()
            gate[0].set()
        box = h.client.mailbox("load")
        assert results["first"].joined is False and results["same"].joined is True
        if joins == "any":  # "other" joined x's request: one request to each rank
            assert results["other"].joined is True and sorted(calls) == ["x", "x"]
            assert results["other"].results == {0: {"load": "x"}, 1: {"load": "x"}}
            assert box.watch_joins == 2
        else:  # only the identical one joined: y went out on its own
            assert results["other"].joined is False and sorted(calls) == ["x", "x", "y", "y"]
            assert results["other"].results == {0: {"load": "y"}, 1: {"load": "y"}}
            assert box.watch_joins == 1
        assert box.watched == 0 and h.client.registry.live_count == 0


async def test_a_watching_starter_leaving_mid_send_fails_the_unsent_ranks_for_the_rest(
        ) -> None:
    """The starter's send to a rank never heard from waits (first contact); a caller
    joins; the starter is cancelled. Nobody is left to send that frame: the joiner
    learns at once that the rank was not delivered to, not at its deadline."""
    gate: list[anyio.Event] = [anyio.Event()]
    calls: list[Any] = []
    async with EngineHarness(ranks=1, setup=lambda ep: _gated(ep, gate, calls)) as h:
        gate[0].set()
        h.client.add_rank(5)  # present, never heard from: its send waits
        starter = anyio.CancelScope()
        outcome: list[Any] = []

        async def start() -> None:
            with starter:
                await h.client.fan_out("load", "x", ranks=[0, 5], mode="watching",
                                       timeout=30)

        async def join() -> None:
            try:
                result = await h.client.fan_out("load", "x", ranks=[0, 5], mode="watching",
                                                timeout=30)
                outcome.append((anyio.current_time(), result))
            except FanOutFailed as exc:
                outcome.append((anyio.current_time(), exc.result))
            except RequestTimedOut:
                outcome.append("timed out")

        async with anyio.create_task_group() as tg:
            tg.start_soon(start)
            await anyio.wait_all_tasks_blocked()
            began = anyio.current_time()
            tg.start_soon(join)
            await anyio.wait_all_tasks_blocked()
            starter.cancel()
        ((when, result),) = outcome
        assert when - began < 1.0  # not the 30 s deadline
        assert isinstance(result.errors[5], NotDelivered) and result.results == {0: {"load": "x"}}
        assert h.client.registry.live_count == 0
