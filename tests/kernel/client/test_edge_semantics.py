"""Exact semantics at the edges: cancellation, close, timeouts,
validation, first contact, blocked sends, and the tests a mutation audit found
missing. Virtual time on asyncio and trio; every test asserts behaviour and
counts, never wall-clock durations."""

from __future__ import annotations

import functools
import math
from types import TracebackType
from typing import Any

import anyio
import pytest

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.errors import (
    ClientClosed,
    NotDelivered,
    RequestTimedOut,
    RequestTooLarge,
)
from ctlwire.states import TicketState
from ctlwire.testing import EngineHarness
from ctlwire.transports.envelope import Envelope, Request
from ctlwire.transports.errors import WouldBlock
from ctlwire.transports.transport import ClientTransport, TransportEvent

# asyncio and trio, both on a virtual clock (ctlwire's pytest plugin)
pytestmark = [pytest.mark.anyio, pytest.mark.ctlwire_virtual_clock]

MODES = ("queueing", "watching", "concurrent")


class Counting:
    """Engine methods that record every run; ``hold`` blocks until released."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, str, Any]] = []
        self.gates: dict[str, anyio.Event] = {}

    def install(self, ep: EngineEndpoint) -> None:
        async def hold(payload: Any = None) -> Any:
            self.runs.append((ep.rank, "hold", payload))
            gate = self.gates.setdefault("hold", anyio.Event())
            await gate.wait()
            return payload

        def act(payload: Any = None) -> Any:
            self.runs.append((ep.rank, "act", payload))
            return payload

        ep.register("hold", hold)
        ep.register("act", act)

    def count(self, method: str) -> int:
        return sum(1 for _, m, _ in self.runs if m == method)

    def release(self, method: str = "hold") -> None:
        self.gates.setdefault(method, anyio.Event()).set()


class BlockingSends(ClientTransport):
    """Wraps a client transport: sends to ranks in ``blocked`` find the
    high-water mark reached (``send_nowait`` raises WouldBlock, ``send`` waits
    for ever). Records how each blocked send ended."""

    def __init__(self, inner: ClientTransport) -> None:
        self.inner = inner
        self.codec = inner.codec
        self.blocked: set[int] = set()
        self.waiting: list[int] = []
        self.cancelled: list[int] = []

    async def __aenter__(self) -> BlockingSends:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.inner.__aexit__(exc_type, exc, tb)

    def send_nowait(self, rank: int, envelope: Envelope) -> None:
        if rank in self.blocked and type(envelope) is Request:
            raise WouldBlock("high-water mark")
        self.inner.send_nowait(rank, envelope)

    async def send(self, rank: int, envelope: Envelope) -> None:
        if rank in self.blocked and type(envelope) is Request:
            self.waiting.append(rank)
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                self.cancelled.append(rank)
                raise
        await self.inner.send(rank, envelope)

    async def receive(self) -> TransportEvent:
        return await self.inner.receive()

    async def receive_many(self, limit: int = 64) -> list[TransportEvent]:
        return await self.inner.receive_many(limit)


async def _flush(h: EngineHarness, ranks: tuple[int, ...] = (0,)) -> None:
    """A call each rank must answer after everything sent before it (serial engine)."""
    for rank in ranks:
        await h.client.call("act", "flush", rank=rank, timeout=5)


# -- 1. a cancelled caller sends nothing ----------------------------------------------
async def test_call_in_a_cancelled_scope_sends_nothing() -> None:
    eng = Counting()
    async with EngineHarness(ranks=1, setup=eng.install) as h:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await h.client.call("act", "cancelled", rank=0, timeout=5)
        assert scope.cancelled_caught
        await _flush(h)
        assert [p for _, _, p in eng.runs] == ["flush"]
        assert h.client.registry.live_count == 0


@pytest.mark.parametrize("mode", MODES)
async def test_fan_out_in_a_cancelled_scope_sends_nothing(mode: str) -> None:
    eng = Counting()
    async with EngineHarness(ranks=2, setup=eng.install) as h:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await h.client.fan_out("act", "cancelled", mode=mode, timeout=5)  # type: ignore[arg-type]
        assert scope.cancelled_caught
        await _flush(h, (0, 1))
        assert [p for _, _, p in eng.runs] == ["flush", "flush"]
        assert h.client.mailbox("act").queue.holder is None


async def test_queued_caller_cancelled_after_handoff_before_resuming_sends_nothing() -> None:
    """A in flight, B and C queued; A's reply comes and the hand-off admits B;
    B is cancelled at that moment, before it runs again: the engine sees A and C
    only."""
    eng = Counting()
    async with EngineHarness(ranks=1, setup=eng.install) as h:
        client = h.client
        b_scope = anyio.CancelScope()
        outcomes: dict[str, Any] = {}

        def cancel_b_when_admitted(ticket: Any, old: Any, event: Any, new: Any) -> None:
            if ticket.seq == 2 and new is TicketState.ADMITTED:
                b_scope.cancel()  # B holds the mailbox now but has not resumed yet

        client.mailbox("hold").queue.observers.append(cancel_b_when_admitted)

        async def a() -> None:
            outcomes["A"] = await client.fan_out("hold", "A", timeout=60)

        async def b() -> None:
            with b_scope:
                outcomes["B"] = await client.fan_out("hold", "B", timeout=60)
            outcomes.setdefault("B", "cancelled")

        async def c() -> None:
            outcomes["C"] = await client.fan_out("hold", "C", timeout=60)

        async with anyio.create_task_group() as tg:
            tg.start_soon(a)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(b)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(c)
            await anyio.wait_all_tasks_blocked()
            assert client.mailbox("hold").depth == 2
            eng.release()
        assert outcomes["B"] == "cancelled"
        assert outcomes["A"].results == {0: "A"} and outcomes["C"].results == {0: "C"}
        assert [p for _, _, p in eng.runs] == ["A", "C"]


# -- 4. close ends every call -------------------------------------------------------------
@pytest.mark.parametrize("timeout", [math.inf, 600.0])
async def test_close_ends_queued_and_in_flight_fan_outs_with_client_closed(
        timeout: float) -> None:
    eng = Counting()
    async with EngineHarness(ranks=2, setup=eng.install) as h:
        client = h.client
        outcomes: list[BaseException | None] = []

        async def caller(i: int) -> None:
            try:
                await client.fan_out("hold", i, timeout=timeout)
            except BaseException as exc:
                outcomes.append(exc)
                if not isinstance(exc, Exception):
                    raise
            else:
                outcomes.append(None)

        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(caller, i)
                await anyio.wait_all_tasks_blocked()
            assert client.mailbox("hold").depth == 4
            start = anyio.current_time()
            await client.aclose()
        # every call ended at close, none at its timeout
        assert anyio.current_time() == start
        assert len(outcomes) == 5
        assert all(type(o) is ClientClosed for o in outcomes), outcomes
        assert client.mailbox("hold").depth == 0
        eng.release()


async def test_close_ends_a_call_in_flight_with_client_closed() -> None:
    eng = Counting()
    async with EngineHarness(ranks=1, setup=eng.install) as h:
        async with anyio.create_task_group() as tg:
            async def closer() -> None:
                await anyio.wait_all_tasks_blocked()
                await h.client.aclose()

            tg.start_soon(closer)
            with pytest.raises(ClientClosed):
                await h.client.call("hold", 1, timeout=math.inf)
        eng.release()


# -- 5. timeouts are validated before anything is sent -----------------------------------
@pytest.mark.parametrize(("timeout", "error"), [
    (0, ValueError), (0.0, ValueError), (-1, ValueError), (math.nan, ValueError),
    ("5", TypeError), (True, TypeError), ([1], TypeError),
])
async def test_bad_timeouts_raise_and_send_nothing(timeout: Any, error: type[Exception]
                                                   ) -> None:
    eng = Counting()
    async with EngineHarness(ranks=2, setup=eng.install) as h:
        with pytest.raises(error):
            await h.client.call("act", "x", rank=0, timeout=timeout)
        for mode in MODES:
            with pytest.raises(error):
                await h.client.fan_out("act", "x", mode=mode, timeout=timeout)  # type: ignore[arg-type]
        assert h.client.registry.stats.registered == 0
        await _flush(h, (0, 1))
        assert [p for _, _, p in eng.runs] == ["flush", "flush"]


def test_bad_default_timeouts_are_refused_at_construction() -> None:
    from ctlwire.transports.memory import MemoryNetwork

    with pytest.raises(ValueError):
        ControlClient(MemoryNetwork().client_transport(), ranks=1, default_timeout=0)
    with pytest.raises(TypeError):
        ControlClient(MemoryNetwork().client_transport(), ranks=1,
                      method_timeouts={"pause": "5"})  # type: ignore[dict-item]


# -- 6. size errors are size errors --------------------------------------------------------
async def test_payload_near_the_limit_is_a_size_error_and_nothing_is_sent() -> None:
    eng = Counting()
    async with EngineHarness(ranks=1, setup=eng.install) as h:
        limit = h.client.codec.max_message_size
        payload = b"x" * (limit - 8)  # fits as a value, not inside an envelope
        assert len(h.client.codec.encode_value(payload)) <= limit
        with pytest.raises(RequestTooLarge) as info:
            await h.client.call("act", payload, rank=0, timeout=5)
        assert info.value.size > limit == info.value.limit
        with pytest.raises(RequestTooLarge):
            await h.client.fan_out("act", payload, timeout=5)
        with pytest.raises(RequestTooLarge):
            await h.client.call("m" * (limit + 1), rank=0, timeout=5)
        assert h.client.registry.stats.registered == 0
        assert h.client.counters["engine_lost"] == 0
        assert (await h.client.call("act", "small", rank=0, timeout=5)) == "small"


# -- 11. a timeout while queued says so ----------------------------------------------------
async def test_timeout_while_queued_says_waiting_for_admission() -> None:
    eng = Counting()
    async with EngineHarness(ranks=1, setup=eng.install) as h:
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(h.client.fan_out, "hold", "A", timeout=60.0))
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(RequestTimedOut) as info:
                await h.client.fan_out("hold", "B", timeout=1.0)
            eng.release()
        assert info.value.admission and info.value.request_id == 0
        assert "timed out waiting for admission to 'hold'" in str(info.value)
        assert "request 0" not in str(info.value)
        assert eng.count("hold") == 1


# -- 2 and 15: a send blocked at the high-water mark ---------------------------------------
def _blocking_harness(eng: Counting, ranks: int = 2) -> tuple[EngineHarness, list[BlockingSends]]:
    wrappers: list[BlockingSends] = []

    def wrap(inner: ClientTransport) -> ClientTransport:
        w = BlockingSends(inner)
        wrappers.append(w)
        return w

    return EngineHarness(ranks=ranks, setup=eng.install, wrap_client=wrap), wrappers


async def test_rank_lost_while_its_send_is_blocked_does_not_stop_the_fan_out() -> None:
    """Rank 0's send waits at the high-water mark, then rank 0 is lost: rank 0
    fails NotDelivered at once and rank 1 is still sent to and answers."""
    eng = Counting()
    h, (t,) = _blocking_harness(eng)
    async with h:
        t.blocked.add(0)
        outcome: dict[str, Any] = {}

        async def fan() -> None:
            outcome["result"] = await h.client.fan_out("act", "x", mode="concurrent",
                                                       timeout=600)
            outcome["at"] = anyio.current_time()

        start = anyio.current_time()
        async with anyio.create_task_group() as tg:
            tg.start_soon(fan)
            await anyio.wait_all_tasks_blocked()
            assert t.waiting == [0]
            h.stop_engine(0)
        result = outcome["result"]
        assert type(result.errors[0]) is NotDelivered
        assert result.results == {1: "x"}
        assert outcome["at"] - start < 600  # at once, not at the timeout
        assert [(r, p) for r, _, p in eng.runs] == [(1, "x")]


async def test_a_send_blocked_at_the_high_water_mark_ends_at_the_calls_deadline() -> None:
    eng = Counting()
    h, (t,) = _blocking_harness(eng, ranks=1)
    async with h:
        t.blocked.add(0)
        start = anyio.current_time()
        with anyio.fail_after(3600):  # a send ignoring the deadline would hang here
            with pytest.raises(RequestTimedOut):
                await h.client.call("act", "x", rank=0, timeout=5)
        assert t.cancelled == [0]
        assert anyio.current_time() - start == pytest.approx(5)
        assert eng.runs == []


async def test_a_blocked_send_to_a_lost_rank_is_cancelled_at_once() -> None:
    """Policy all over 3 ranks: losing rank 0 does not decide the request, so
    only cancelling rank 0's blocked send lets the fan-out go on."""
    eng = Counting()
    h, (t,) = _blocking_harness(eng, ranks=3)
    async with h:
        t.blocked.add(0)
        async with anyio.create_task_group() as tg:
            async def lose_rank_0() -> None:
                await anyio.wait_all_tasks_blocked()
                assert t.waiting == [0] and t.cancelled == []
                h.stop_engine(0)

            tg.start_soon(lose_rank_0)
            with anyio.fail_after(300):  # well before the call's own 600 s
                res = await h.client.fan_out("act", "y", policy="quorum", mode="concurrent",
                                             timeout=600)
        assert t.cancelled == [0]
        assert res.results == {1: "y", 2: "y"} and type(res.errors[0]) is NotDelivered


async def test_a_blocked_send_is_abandoned_once_its_request_is_decided() -> None:
    """Policy first over 2 ranks: rank 1's send waits at the high-water mark, rank 0
    answers and decides the request: rank 1's send gives up at once, not at the
    deadline, and the fan-out returns rank 0's answer."""
    eng = Counting()
    h, (t,) = _blocking_harness(eng, ranks=2)
    async with h:
        t.blocked.add(1)
        start = anyio.current_time()
        with anyio.fail_after(300):  # well before the call's own 600 s
            res = await h.client.fan_out("act", "z", policy="first", mode="concurrent",
                                         timeout=600)
        assert anyio.current_time() - start < 300
        assert res.results == {0: "z"} and t.waiting == [1] and t.cancelled == [1]
        assert [(r, p) for r, _, p in eng.runs] == [(0, "z")]


# -- 7. first contact ------------------------------------------------------------------------
async def test_a_call_waits_for_a_rank_that_has_not_connected_yet() -> None:
    from ctlwire.transports.memory import MemoryNetwork

    eng = Counting()
    net = MemoryNetwork()
    async with ControlClient(net.client_transport(), ranks=2) as client:
        async with anyio.create_task_group() as tg:
            results: dict[str, Any] = {}

            async def caller() -> None:
                results["call"] = await client.call("act", "first", rank=1, timeout=30)
                results["fan"] = (await client.fan_out("act", "all", timeout=30)).results

            tg.start_soon(caller)
            await anyio.wait_all_tasks_blocked()
            assert eng.runs == []
            for rank in (1, 0):  # engines start after the client, in any order
                ep = EngineEndpoint(net.engine_transport(rank))
                eng.install(ep)
                tg.start_soon(ep.serve)
                await anyio.wait_all_tasks_blocked()
            while "fan" not in results:
                await anyio.sleep(0.1)
            tg.cancel_scope.cancel()
        assert results == {"call": "first", "fan": {0: "all", 1: "all"}}


async def test_a_rank_never_heard_from_fails_not_delivered_at_the_deadline() -> None:
    from ctlwire.transports.memory import MemoryNetwork

    net = MemoryNetwork()
    async with ControlClient(net.client_transport(), ranks=1) as client:
        with pytest.raises(NotDelivered, match="never heard from"):
            await client.call("act", "x", rank=0, timeout=5)
        assert client.registry.live_count == 0


async def test_a_rank_that_was_connected_and_is_lost_fails_at_once() -> None:
    eng = Counting()
    async with EngineHarness(ranks=1, setup=eng.install) as h:
        h.stop_engine(0)
        await anyio.wait_all_tasks_blocked()
        start = anyio.current_time()
        with pytest.raises(NotDelivered):
            await h.client.call("act", "x", rank=0, timeout=600)
        assert anyio.current_time() == start


# -- 15. tests the mutation audit found missing ------------------------------------------------
async def test_watching_mode_shares_only_requests_with_the_same_policy() -> None:
    """An ``all`` and a ``first`` fan-out with the same payload are different
    requests: the engine runs both; identical ones share one."""
    eng = Counting()
    async with EngineHarness(ranks=2, setup=eng.install) as h:
        results: dict[str, Any] = {}

        async def watch(name: str, policy: str) -> None:
            results[name] = await h.client.fan_out("hold", "same", mode="watching",
                                                   policy=policy, timeout=60)  # type: ignore[arg-type]

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch, "all-1", "all")
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(watch, "first", "first")
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(watch, "all-2", "all")
            await anyio.wait_all_tasks_blocked()
            assert h.client.mailbox("hold").watched == 2
            assert h.client.mailbox("hold").watch_joins == 1
            eng.release()
        assert eng.count("hold") == 4  # two requests, two ranks each
        assert results["all-1"].results == results["all-2"].results == {0: "same", 1: "same"}
        assert results["all-1"].request_id == results["all-2"].request_id
        assert results["first"].request_id != results["all-1"].request_id
        assert results["first"].policy.value == "first"


def test_tombstone_eviction_drops_the_oldest_first() -> None:
    from ctlwire.kernel.core.request_registry import ReplyDisposition, RequestRegistry
    from ctlwire.transports.envelope import Reply

    reg = RequestRegistry(max_tombstones=2)
    ids = []
    for _ in range(3):
        entry = reg.register("m", (0,))
        reg.plan_sends(entry)
        reg.sent(entry, 0)
        reply = Reply(entry.id, 0, 1, True, reg_nil())
        assert reg.on_reply(reply)[0] is ReplyDisposition.COMPLETED
        reg.release(entry)
        ids.append(entry.id)
    oldest, middle, newest = ids
    # the two newest keep their tombstones: a second reply is a duplicate
    assert reg.on_reply(Reply(newest, 0, 1, True, reg_nil()))[0] is ReplyDisposition.DUPLICATE
    assert reg.on_reply(Reply(middle, 0, 1, True, reg_nil()))[0] is ReplyDisposition.DUPLICATE
    # the oldest was evicted: only known as issued, so counted late
    assert reg.on_reply(Reply(oldest, 0, 1, True, reg_nil()))[0] is ReplyDisposition.LATE
    assert reg.stats.duplicate == 2 and reg.stats.late == 1
    assert reg.tombstone_count == 2


def reg_nil() -> Any:
    import msgspec

    return msgspec.Raw(b"\xc0")


async def test_an_engine_skips_work_whose_deadline_passed_end_to_end() -> None:
    """B is queued at a busy engine behind A; B's caller times out; when the
    engine reaches B, it does not run it (DeadlineExpired), and the caller's
    registry counts the late error reply."""
    eng = Counting()
    skew = {"s": 0.0}

    import time as _time

    async with EngineHarness(ranks=1, setup=eng.install,
                             engine_kwargs={"clock": lambda: _time.time() + skew["s"]}) as h:
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(h.client.call, "hold", "A", rank=0, timeout=600))
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(RequestTimedOut):  # B waits behind A (one method: serial)
                await h.client.call("hold", "B", rank=0, timeout=5)
            skew["s"] = 3600.0  # the engine's clock is now far past B's deadline
            eng.release()
        await _flush_after_skew(h, skew)
        ep = h.engines[0]
        assert [p for _, _, p in eng.runs] == ["A", "flush"]  # B never ran
        assert ep.counters["expired"] == 1
        assert h.client.registry.stats.late == 1  # B's DeadlineExpired reply, dropped


async def _flush_after_skew(h: EngineHarness, skew: dict[str, float]) -> None:
    await anyio.wait_all_tasks_blocked()  # the engine has handled B
    skew["s"] = 0.0
    await _flush(h)


# -- 3. payload validation is never silently off -----------------------------------------------
async def test_a_locally_defined_struct_annotation_is_resolved_and_validated() -> None:
    import msgspec

    from ctlwire.kernel.errors import RemoteError

    seen: list[Any] = []

    def setup(ep: EngineEndpoint) -> None:
        class Version(msgspec.Struct):  # local: invisible to get_type_hints
            version: int

        @ep.method()
        def update_weights(req: Version) -> int:
            seen.append(req)
            return req.version

        def set_version(req: Version) -> int:
            seen.append(req)
            return req.version

        ep.register("set_version", set_version)
        assert ep.method_table.specs["update_weights"].payload_type is Version
        assert ep.method_table.specs["set_version"].payload_type is Version

    async with EngineHarness(ranks=1, setup=setup) as h:
        for method in ("update_weights", "set_version"):
            with pytest.raises(RemoteError) as info:
                await h.client.call(method, {"version": "not-an-int"}, rank=0, timeout=5)
            assert info.value.type_name == "InvalidPayload"
            assert await h.client.call(method, {"version": 3}, rank=0, timeout=5) == 3
        assert [type(v).__name__ for v in seen] == ["Version", "Version"]


def test_an_unresolvable_payload_annotation_raises_at_registration() -> None:
    from ctlwire.transports.memory import MemoryNetwork

    ep = EngineEndpoint(MemoryNetwork().engine_transport(0))

    def handler(req: NoSuchType) -> int:  # type: ignore[name-defined] # noqa: F821
        return 0

    with pytest.raises(TypeError, match="NoSuchType"):
        ep.register("h", handler)
    with pytest.raises(TypeError, match="NoSuchType"):
        ep.method("h2")(handler)
    assert ep.methods == []
    ep.register("h3", handler, payload_type=int)  # explicit: fine
    assert ep.method_table.specs["h3"].payload_type is int


# -- 8. poll() before open() -------------------------------------------------------------
async def test_poll_before_open_opens_the_endpoint_and_serves() -> None:
    from ctlwire.transports.errors import TransportClosed
    from ctlwire.transports.memory import MemoryNetwork

    net = MemoryNetwork()
    ep = EngineEndpoint(net.engine_transport(0))
    Counting().install(ep)
    async with ControlClient(net.client_transport(), ranks=1) as client:
        async with anyio.create_task_group() as tg:
            handled: list[int] = []

            async def engine_loop() -> None:
                while True:
                    handled.append(ep.poll())  # never opened explicitly
                    await anyio.sleep(0.01)

            tg.start_soon(engine_loop)
            assert await client.call("act", "polled", rank=0, timeout=5) == "polled"
            tg.cancel_scope.cancel()
        assert sum(handled) == 1
    ep.close()
    with pytest.raises(TransportClosed, match="after close"):
        ep.poll()


# -- 10. a deeply nested request is answered like any malformed frame ---------------------
class NestingSends(BlockingSends):
    """Replaces the payload of every Request with one nested 200,000 levels deep."""

    def send_nowait(self, rank: int, envelope: Envelope) -> None:
        if type(envelope) is Request:
            import msgspec

            nested = b"\x91" * 200_000 + b"\xc0"
            envelope = msgspec.structs.replace(envelope, payload=msgspec.Raw(nested))
        self.inner.send_nowait(rank, envelope)


async def test_a_deeply_nested_request_gets_a_typed_error_reply() -> None:
    from ctlwire.kernel.errors import RemoteError

    eng = Counting()
    async with EngineHarness(ranks=1, setup=eng.install, wrap_client=NestingSends) as h:
        start = anyio.current_time()
        with pytest.raises(RemoteError) as info:
            await h.client.call("act", "x", rank=0, timeout=600)
        assert info.value.type_name == "MalformedFrame"
        assert anyio.current_time() == start  # answered, not left to time out
        assert h.engines[0].counters["error_replies_for_bad_frames"] == 1
        assert eng.runs == []


@pytest.mark.parametrize("codec_name", ["msgpack", "json"])
def test_salvage_id_reads_the_head_of_a_frame_too_deep_to_decode(codec_name: str) -> None:
    import msgspec

    from ctlwire.transports.codec import codec_by_name

    codec = codec_by_name(codec_name)
    depth = 200_000
    nested = (b"\x91" * depth + b"\xc0" if codec_name == "msgpack"
              else b"[" * depth + b"]" * depth)
    for rid in (5, 300, 70_000, 12_345_678_901, 2**63 - 1):
        data = codec.encode(Request(rid, 0, "m", msgspec.Raw(nested)))
        assert codec.salvage_id(data) == rid
    assert codec.salvage_id(b"\x00" * 10) == 0


# -- 13. keys generate does not overwrite ---------------------------------------------------------
def test_keys_generate_refuses_to_overwrite_without_force(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from ctlwire.app.cli import main

    assert main(["keys", "generate", str(tmp_path), "api"]) == 0
    public = (tmp_path / "api.key").read_bytes()
    secret = (tmp_path / "api.key_secret").read_bytes()
    capsys.readouterr()
    assert main(["keys", "generate", str(tmp_path), "engine", "api"]) == 2
    assert "--force" in capsys.readouterr().err
    assert (tmp_path / "api.key").read_bytes() == public
    assert (tmp_path / "api.key_secret").read_bytes() == secret
    assert not (tmp_path / "engine.key").exists()  # nothing written at all
    assert main(["keys", "generate", str(tmp_path), "api", "--force"]) == 0
    assert (tmp_path / "api.key").read_bytes() != public


# -- 9. serve mode: async handlers concurrent across methods, serial per method ----------
class Lanes:
    """update_weights (async, blocks on a gate per call), get_server_info (sync),
    get_load (async, concurrency 2); records starts and ends."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.gates: list[anyio.Event] = []
        self.endpoint: EngineEndpoint | None = None

    def install(self, ep: EngineEndpoint) -> None:
        self.endpoint = ep

        async def update_weights(version: int) -> int:
            self.log.append(f"start {version}")
            gate = anyio.Event()
            self.gates.append(gate)
            await gate.wait()
            self.log.append(f"end {version}")
            return version

        def get_server_info() -> dict[str, Any]:
            return {"running": sorted(m for m, _ in ep.running.values())}

        async def get_load(n: int) -> int:
            self.log.append(f"load {n}")
            gate = anyio.Event()
            self.gates.append(gate)
            await gate.wait()
            return n

        ep.register("update_weights", update_weights)
        ep.register("get_server_info", get_server_info)
        ep.register("get_load", get_load, concurrency=2)


async def test_a_long_async_handler_does_not_delay_other_methods() -> None:
    lanes = Lanes()
    async with EngineHarness(ranks=1, setup=lanes.install) as h:
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(h.client.call, "update_weights", 1, timeout=600))
            await anyio.wait_all_tasks_blocked()
            assert lanes.log == ["start 1"]
            # answered while update_weights still runs (would time out before)
            info = await h.client.call("get_server_info", rank=0, timeout=5)
            assert info == {"running": ["get_server_info", "update_weights"]}
            assert next(iter(h.engines[0].running.values()))[0] == "update_weights"
            lanes.gates[0].set()
        assert h.engines[0].running == {}


async def test_requests_of_one_method_stay_serial_and_in_arrival_order() -> None:
    lanes = Lanes()
    async with EngineHarness(ranks=1, setup=lanes.install) as h:
        results: list[int] = []

        async def update(v: int) -> None:
            results.append(await h.client.call("update_weights", v, timeout=600))

        async with anyio.create_task_group() as tg:
            for v in (1, 2, 3):
                tg.start_soon(update, v)
                await anyio.wait_all_tasks_blocked()
            assert lanes.log == ["start 1"]  # 2 and 3 wait behind 1
            for expected in (1, 2, 3):
                await anyio.wait_all_tasks_blocked()
                assert lanes.log[-1] == f"start {expected}"
                lanes.gates[expected - 1].set()
        assert lanes.log == ["start 1", "end 1", "start 2", "end 2", "start 3", "end 3"]
        assert results == [1, 2, 3]


async def test_a_method_runs_up_to_its_concurrency() -> None:
    lanes = Lanes()
    async with EngineHarness(ranks=1, setup=lanes.install) as h, \
            anyio.create_task_group() as tg:
        for n in (1, 2, 3):
            tg.start_soon(functools.partial(h.client.call, "get_load", n, timeout=600))
            await anyio.wait_all_tasks_blocked()
        assert lanes.log == ["load 1", "load 2"]  # the third waits for a slot
        assert sorted(m for m, _ in h.engines[0].running.values()) == ["get_load"] * 2
        lanes.gates[0].set()
        await anyio.wait_all_tasks_blocked()
        assert lanes.log == ["load 1", "load 2", "load 3"]
        for gate in lanes.gates[1:]:
            gate.set()


def test_concurrency_must_be_a_positive_int() -> None:
    from ctlwire.transports.memory import MemoryNetwork

    ep = EngineEndpoint(MemoryNetwork().engine_transport(0))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            ep.register("m", lambda: None, concurrency=bad)  # type: ignore[arg-type]


async def test_close_ends_wait_ready_with_client_closed() -> None:
    from ctlwire.transports.memory import MemoryNetwork

    client = ControlClient(MemoryNetwork().client_transport(), ranks=1)

    async def closer() -> None:
        await anyio.wait_all_tasks_blocked()
        await client.aclose()

    async with client, anyio.create_task_group() as tg:
        tg.start_soon(closer)
        with pytest.raises(ClientClosed):
            await client.wait_ready(timeout=600)


# -- 14. policy "all": remote errors are results, local failures raise ---------------------
async def test_policy_all_returns_remote_errors_and_raises_only_when_no_rank_answered() -> None:
    from ctlwire.kernel.errors import FanOutFailed, RemoteError

    def setup(ep: EngineEndpoint) -> None:
        def fail() -> None:
            raise RuntimeError(f"rank {ep.rank} refuses")

        ep.register("fail", fail)

    async with EngineHarness(ranks=2, setup=setup) as h:
        res = await h.client.fan_out("fail", timeout=5)  # every rank raised: returns
        assert res.results == {} and sorted(res.errors) == [0, 1]
        assert all(isinstance(e, RemoteError) for e in res.errors.values())
        with pytest.raises(RemoteError, match="rank 0 refuses"):
            res.raise_for_errors()
        h.stop_engine(0)
        h.stop_engine(1)
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(FanOutFailed):  # no rank could answer at all
            await h.client.fan_out("fail", timeout=5)
