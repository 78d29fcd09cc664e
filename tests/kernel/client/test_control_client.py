"""ControlClient over the in-memory transport, in virtual time on asyncio and trio."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
import pytest

from ctlwire.kernel.client.control_client import ControlClient, ResultTypeError
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.errors import (
    ClientClosed,
    EngineDead,
    FanOutFailed,
    RemoteError,
    RequestTimedOut,
)
from ctlwire.states import RequestState
from ctlwire.testing import EngineHarness, TransitionRecorder
from ctlwire.transports.envelope import NO_DEADLINE, Reply, Request
from ctlwire.transports.memory import MemoryClientTransport
from ctlwire.transports.transport import TransportEvent

# asyncio and trio, both on a virtual clock (ctlwire's pytest plugin)
pytestmark = [pytest.mark.anyio, pytest.mark.ctlwire_virtual_clock]


class Weights(msgspec.Struct):
    version: int
    path: str = ""


class Gate:
    """Handlers that block until the test opens them, one event per call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, Any]] = []
        self.events: list[anyio.Event] = []

    def install(self, ep: EngineEndpoint) -> None:
        async def slow(payload: Any = None) -> Any:
            ev = anyio.Event()
            self.calls.append((ep.rank, payload))
            self.events.append(ev)
            await ev.wait()
            return {"rank": ep.rank, "echo": payload}

        ep.register("slow", slow)

    def open_next(self) -> None:
        for ev in self.events:
            if not ev.is_set():
                ev.set()
                return
        raise AssertionError("no call waiting at the gate")


def basic_methods(ep: EngineEndpoint) -> None:
    state = {"version": 0, "paused": False}

    @ep.method()
    def get_server_info() -> dict[str, Any]:
        return {"rank": ep.rank, "version": state["version"], "paused": state["paused"]}

    @ep.method()
    def update_weights(w: Weights) -> int:
        if not state["paused"]:
            raise PermissionError("update_weights needs a paused engine")
        state["version"] = w.version
        return w.version

    @ep.method()
    def pause() -> bool:
        state["paused"] = True
        return True

    @ep.method()
    def resume() -> bool:
        state["paused"] = False
        return True

    @ep.method()
    def fail_with_code() -> None:
        err = ValueError("bad things")
        err.code = 17  # type: ignore[attr-defined]
        raise err

    @ep.method()
    async def never() -> None:
        await anyio.sleep_forever()

    @ep.method()
    def rank_only_zero_ok() -> int:
        if ep.rank != 0:
            raise RuntimeError(f"rank {ep.rank} refuses")
        return 0


def assert_clean(client: ControlClient) -> None:
    assert client.registry.live_count == 0
    client.registry.check_invariants()


async def test_call_and_typed_remote_errors() -> None:
    async with EngineHarness(ranks=2, setup=basic_methods) as h:
        c = h.client
        assert await c.call("get_server_info", rank=1) == {"rank": 1, "version": 0,
                                                           "paused": False}
        with pytest.raises(RemoteError) as info:
            await c.call("update_weights", {"version": 3}, rank=0)
        assert info.value.type_name == "PermissionError"
        assert "paused" in info.value.message
        assert info.value.rank == 0
        with pytest.raises(RemoteError) as info:
            await c.call("fail_with_code")
        assert (info.value.type_name, info.value.code) == ("ValueError", 17)
        with pytest.raises(RemoteError) as info:
            await c.call("no_such_method")
        assert info.value.type_name == "UnknownMethod"
        with pytest.raises(RemoteError) as info:
            await c.call("update_weights", {"version": "three"})
        assert info.value.type_name == "InvalidPayload"
        with pytest.raises(ResultTypeError):
            await c.call("get_server_info", result_type=int)
        assert_clean(c)


async def test_rl_cycle_fan_out_reaches_every_rank() -> None:
    async with EngineHarness(ranks=4, setup=basic_methods) as h:
        c = h.client
        for version in (1, 2):
            assert (await c.fan_out("pause")).results == {r: True for r in range(4)}
            res = await c.fan_out("update_weights", Weights(version, "/w"))
            assert res.ok and res.results == {r: version for r in range(4)}
            assert (await c.fan_out("resume")).ok
        info = await c.fan_out("get_server_info", mode="watching")
        assert [info.results[r]["version"] for r in range(4)] == [2, 2, 2, 2]
        assert_clean(c)


async def test_fan_out_reports_per_rank_errors_not_only_rank_zero() -> None:
    async with EngineHarness(ranks=3, setup=basic_methods) as h:
        res = await h.client.fan_out("rank_only_zero_ok")
        assert res.results == {0: 0}
        assert set(res.errors) == {1, 2}
        assert all(isinstance(e, RemoteError) and e.type_name == "RuntimeError"
                   for e in res.errors.values())
        assert not res.ok
        with pytest.raises(RemoteError):
            res.raise_for_errors()
        first = await h.client.fan_out("rank_only_zero_ok", policy="first")
        assert 0 in first.results
        with pytest.raises(FanOutFailed) as info:
            await h.client.fan_out("rank_only_zero_ok", policy="quorum")
        # decided as soon as two ranks refused: rank 0 may not have answered yet
        assert set(info.value.result.errors) == {1, 2}
        assert info.value.result.results in ({}, {0: 0})
        assert_clean(h.client)


class SuspendingSend(MemoryClientTransport):
    """A client transport whose sends always suspend after handing over the frame,
    until every other task is blocked: the engine answers (and the reply is
    routed) before the caller can reach its wait."""

    def send_nowait(self, rank: int, envelope: Any) -> None:
        from ctlwire.transports.errors import WouldBlock

        if isinstance(envelope, Request):
            raise WouldBlock("always take the slow path")
        super().send_nowait(rank, envelope)

    async def send(self, rank: int, envelope: Any) -> None:
        await super().send(rank, envelope)
        await anyio.wait_all_tasks_blocked()


async def test_bug1_reply_before_wait_completes_at_once(
        ctlwire_harness: Callable[..., EngineHarness], transition_recorder: TransitionRecorder
) -> None:
    """FastDeploy's hang: the reply beats the caller's wait. Here it is a legal
    Sent -> Done transition; the call returns at once, with no timeout."""
    recorder = transition_recorder
    async with ctlwire_harness(ranks=1, setup=basic_methods) as h:
        h.network._client.__class__ = SuspendingSend  # type: ignore[union-attr]
        start = anyio.current_time()
        info = await h.client.call("get_server_info", timeout=600.0)
        elapsed = anyio.current_time() - start
        assert info["rank"] == 0
        assert elapsed < 1.0, f"the call waited {elapsed} s (virtual): the reply was lost"
        (rid,) = recorder.ids("get_server_info")
        recorder.assert_path(rid, ["REGISTERED", "SENT", "DONE", "CLEANED"])
        assert_clean(h.client)


async def test_timeout_is_typed_and_late_reply_is_counted() -> None:
    gate = Gate()

    def setup(ep: EngineEndpoint) -> None:
        basic_methods(ep)
        gate.install(ep)

    async with EngineHarness(ranks=1, setup=setup) as h:
        c = h.client
        start = anyio.current_time()
        with pytest.raises(RequestTimedOut) as info:
            await c.call("slow", "x", timeout=600.0)
        assert 600.0 <= anyio.current_time() - start < 601.0
        assert info.value.method == "slow" and info.value.timeout == 600.0
        assert_clean(c)
        assert c.registry.tombstone_count == 1
        gate.open_next()  # the engine finally answers
        await anyio.wait_all_tasks_blocked()
        assert c.registry.stats.late == 1
        assert c.registry.stats.unknown == 0
        assert_clean(c)


async def test_duplicate_and_unknown_replies_are_counted_and_dropped() -> None:
    async with EngineHarness(ranks=1, setup=basic_methods) as h:
        c = h.client
        codec = h.network.codec
        await c.call("get_server_info")
        (rid,) = [k for k in c.registry._tombstones]
        ep = h.engines[0]
        dup = Reply(rid, 0, ep.incarnation, True, codec.encode_value("again"))
        h.network.inject_to_client(0, codec.encode(dup))
        forged = Reply(12345, 0, ep.incarnation, True, codec.encode_value("who?"))
        h.network.inject_to_client(0, codec.encode(forged))
        h.network.inject_to_client(0, b"\x00garbage")
        await anyio.wait_all_tasks_blocked()
        stats = c.registry.stats
        assert (stats.duplicate, stats.unknown, stats.late) == (1, 1, 0)
        assert c.counters["dropped_malformed"] == 1
        assert await c.call("get_server_info") == {"rank": 0, "version": 0, "paused": False}
        assert_clean(c)


async def test_tombstones_are_bounded() -> None:
    async with EngineHarness(ranks=1, setup=basic_methods,
                             client_kwargs={"max_tombstones": 16}) as h:
        for _ in range(50):
            await h.client.call("get_server_info")
        assert h.client.registry.tombstone_count == 16
        assert h.client.registry.stats.cleaned == 50
        assert_clean(h.client)


async def test_cancellation_at_every_await_leaves_no_entry() -> None:
    gate = Gate()

    def setup(ep: EngineEndpoint) -> None:
        gate.install(ep)

    async with EngineHarness(ranks=2, setup=setup) as h:
        c = h.client
        # cancelled while awaiting the reply
        with anyio.move_on_after(5.0):
            await c.call("slow", 1)
        assert_clean(c)
        # cancelled while queued behind another fan-out, and while in flight
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.fan_out, "slow", "holder")
            await anyio.wait_all_tasks_blocked()
            scope = anyio.CancelScope()
            tg.start_soon(_cancel_soon, scope)
            with scope:
                await c.fan_out("slow", "queued")
            assert scope.cancelled_caught
            assert c.mailbox("slow").depth == 0
            tg.cancel_scope.cancel()
        assert_clean(c)
        # the awaiting call and the in-flight holder were cancelled; the queued
        # caller never registered a request
        assert c.registry.stats.outcomes.get(RequestState.CANCELLED) == 2
        assert c.mailbox("slow").queue.abandoned_total == 1


async def _cancel_soon(scope: anyio.CancelScope) -> None:
    await anyio.wait_all_tasks_blocked()
    scope.cancel()


async def test_engine_death_fails_pending_call_at_once() -> None:
    gate = Gate()

    def setup(ep: EngineEndpoint) -> None:
        basic_methods(ep)
        gate.install(ep)

    async with EngineHarness(ranks=2, setup=setup) as h:
        c = h.client
        async with anyio.create_task_group() as tg:
            outcome: list[BaseException] = []

            async def caller() -> None:
                try:
                    await c.call("slow", rank=1, timeout=600.0)
                except EngineDead as exc:
                    outcome.append(exc)

            tg.start_soon(caller)
            await anyio.wait_all_tasks_blocked()
            start = anyio.current_time()
            h.stop_engine(1)
        assert anyio.current_time() - start < 1.0
        assert len(outcome) == 1 and outcome[0].rank == 1  # type: ignore[attr-defined]
        # the other rank keeps serving; the dead one fails fast
        assert (await c.call("get_server_info", rank=0))["rank"] == 0
        with pytest.raises(EngineDead):
            await c.call("get_server_info", rank=1)
        res = await c.fan_out("get_server_info")
        assert set(res.results) == {0} and isinstance(res.errors[1], EngineDead)
        assert_clean(c)


async def test_silent_engine_is_lost_after_missed_heartbeats() -> None:
    gate = Gate()

    def setup(ep: EngineEndpoint) -> None:
        gate.install(ep)

    async with EngineHarness(ranks=1, setup=setup) as h:
        c = h.client
        ep = h.engines[0]
        ep.heartbeats_paused = True  # keeps its socket, stops heartbeating (hung process)
        await anyio.sleep(0.3)
        start = anyio.current_time()
        with pytest.raises(EngineDead):
            await c.call("slow", timeout=600.0)
        detected = anyio.current_time() - start
        assert detected <= 4 * 0.25 + 0.5
        assert c.peers.snapshot() == {0: "LOST"}
        assert_clean(c)


async def test_restarted_engine_rejoins_and_old_incarnation_is_dropped() -> None:
    async with EngineHarness(ranks=1, setup=basic_methods) as h:
        c = h.client
        old = h.engines[0].incarnation
        h.stop_engine(0)
        await anyio.wait_all_tasks_blocked()
        assert c.peers.snapshot() == {0: "LOST"}
        new_ep = await h.start_engine(0)
        await c.wait_ready(timeout=5)
        assert new_ep.incarnation != old
        assert (await c.call("get_server_info"))["rank"] == 0
        stale = Reply(1, 0, old, True, h.network.codec.encode_value(None))
        h.network.inject_to_client(0, h.network.codec.encode(stale))
        await anyio.wait_all_tasks_blocked()
        assert c.counters["stale_incarnation"] == 1
        assert_clean(c)


async def test_watching_mode_shares_one_request_with_own_copies() -> None:
    gate = Gate()

    def setup(ep: EngineEndpoint) -> None:
        gate.install(ep)

    async with EngineHarness(ranks=2, setup=setup) as h:
        c = h.client
        results: list[Any] = []

        async def watcher() -> None:
            results.append(await c.fan_out("slow", {"k": [1]}, mode="watching"))

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(watcher)
            await anyio.wait_all_tasks_blocked()
            assert len(gate.calls) == 2  # one request, to each of the 2 ranks
            assert c.mailbox("slow").watch_joins == 4
            gate.open_next()
            gate.open_next()
        assert len(results) == 5
        assert all(r.results[0] == {"rank": 0, "echo": {"k": [1]}} for r in results)
        results[0].results[0]["echo"]["k"].append(2)
        assert results[1].results[0]["echo"]["k"] == [1]
        assert_clean(c)


async def test_watching_leader_cancellation_does_not_starve_watchers() -> None:
    gate = Gate()

    def setup(ep: EngineEndpoint) -> None:
        gate.install(ep)

    async with EngineHarness(ranks=1, setup=setup) as h:
        c = h.client
        got: list[Any] = []
        async with anyio.create_task_group() as tg:
            leader = anyio.CancelScope()

            async def lead() -> None:
                with leader:
                    await c.fan_out("slow", None, mode="watching")

            async def watch() -> None:
                got.append(await c.fan_out("slow", None, mode="watching"))

            tg.start_soon(lead)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(watch)
            await anyio.wait_all_tasks_blocked()
            leader.cancel()
            await anyio.wait_all_tasks_blocked()
            gate.open_next()
        assert len(got) == 1 and got[0].results[0]["rank"] == 0
        assert len(gate.calls) == 1
        assert_clean(c)


async def test_closing_the_client_fails_pending_calls() -> None:
    gate = Gate()

    def setup(ep: EngineEndpoint) -> None:
        gate.install(ep)

    async with EngineHarness(ranks=1, setup=setup) as h:
        c = h.client
        errors: list[BaseException] = []

        async def caller() -> None:
            try:
                await c.call("slow", timeout=600.0)
            except ClientClosed as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(caller)
            await anyio.wait_all_tasks_blocked()
            await c.aclose()
        assert len(errors) == 1
        with pytest.raises(ClientClosed):
            await c.call("slow")
        assert_clean(c)


def spy_requests(h: EngineHarness) -> list[Request]:
    """The requests ``h``'s client sends from now on, in order."""
    seen: list[Request] = []

    class Spy(MemoryClientTransport):
        def send_nowait(self, rank: int, envelope: Any) -> None:
            if isinstance(envelope, Request):
                seen.append(envelope)
            super().send_nowait(rank, envelope)

    h.network._client.__class__ = Spy  # type: ignore[union-attr]
    return seen


async def test_per_method_default_timeouts_and_deadline_in_envelope() -> None:
    async with EngineHarness(ranks=1, setup=basic_methods,
                             client_kwargs={"method_timeouts": {"pause": 7.0},
                                            "default_timeout": 3.0}) as h:
        seen = spy_requests(h)
        before = time.time()
        await h.client.call("pause")
        await h.client.call("resume")
        await h.client.call("resume", timeout=11.0)
        after = time.time()
        budgets = [r.deadline - before for r in seen]
        assert 7.0 - 1 <= budgets[0] <= 7.0 + (after - before)
        assert 3.0 - 1 <= budgets[1] <= 3.0 + (after - before)
        assert 11.0 - 1 <= budgets[2] <= 11.0 + (after - before)
        assert h.client.timeout_for("pause") == 7.0
        assert [r.seq for r in seen] == [1, 2, 3]


async def test_the_envelope_carries_the_call_deadline_and_none_for_an_infinite_budget(
        ) -> None:
    async with EngineHarness(ranks=1, setup=basic_methods) as h:
        seen = spy_requests(h)
        before = time.time()
        assert await h.client.call("pause", timeout=math.inf) is True
        assert await h.client.call("pause", timeout=5.0) is True
        after = time.time()
        unbounded, bounded = seen
        assert unbounded.deadline == NO_DEADLINE
        assert before + 5.0 <= bounded.deadline <= after + 5.0


async def test_transport_event_types_are_exhaustive() -> None:
    # guards the client's dispatch on event types: an unexpected event is ignored, not fatal
    async with EngineHarness(ranks=1, setup=basic_methods) as h:
        weird: TransportEvent = object()  # type: ignore[assignment]
        h.client.receiver.on_event(weird, 0.0)
        assert (await h.client.call("resume")) is True


async def test_ranks_outside_the_client_are_a_usage_error() -> None:
    async with EngineHarness(ranks=2, setup=basic_methods) as h:
        with pytest.raises(ValueError, match="rank 5"):
            await h.client.call("resume", rank=5)
        with pytest.raises(ValueError):
            await h.client.fan_out("resume", ranks=[0, 7])
        with pytest.raises(ValueError):
            await h.client.fan_out("resume", ranks=[])
        assert (await h.client.fan_out("resume", ranks=[1])).results == {1: True}


async def test_transport_closed_underneath_fails_pending_calls_at_once() -> None:
    gate = Gate()

    def setup(ep: EngineEndpoint) -> None:
        gate.install(ep)

    async with EngineHarness(ranks=1, setup=setup) as h:
        c = h.client
        outcome: list[BaseException] = []

        async def caller() -> None:
            try:
                await c.call("slow", timeout=600.0)
            except ClientClosed as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(caller)
            await anyio.wait_all_tasks_blocked()
            start = anyio.current_time()
            h.network._client._close_streams()  # type: ignore[union-attr]
        assert anyio.current_time() - start < 0.1
        assert len(outcome) == 1 and c.closed
