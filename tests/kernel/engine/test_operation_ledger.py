"""The engine-side ledger (fencing, once per key, last applied) and the runner's shell,
on the in-memory harness (the behaviour is not about processes)."""

from __future__ import annotations

import sys
import threading
from typing import Any

import msgspec
import pytest

from ctlwire.app.operation_engine import Fault, register, weight_update_plan
from ctlwire.kernel.core.operation_core import StepOutcome
from ctlwire.kernel.core.operation_plan import OperationPlan, OperationStep, StepCall
from ctlwire.kernel.core.operation_result import ProgressEvent
from ctlwire.kernel.engine.operation_ledger import (
    Fenced as EngineFenced,
)
from ctlwire.kernel.engine.operation_ledger import (
    InvalidStep,
    OperationAborted,
    OperationLedger,
    OperationOwned,
    StepNotApplied,
    StepOutOfOrder,
    StepRequest,
    TakeOver,
    UnknownStepMethod,
)
from ctlwire.kernel.errors import (
    Fenced,
    NotDelivered,
    OutcomeUnknown,
    RemoteError,
    RequestTimedOut,
)
from ctlwire.kernel.operations.runner import OperationRunner, ReleaseRefused, classify
from ctlwire.states import OperationState, RankState
from ctlwire.testing import EngineHarness
from ctlwire.transports.codec import MsgpackCodec

CODEC = MsgpackCodec()


class Bump(msgspec.Struct, frozen=True):
    by: int


class FakeEndpoint:
    """Just what OperationLedger.install uses."""

    def __init__(self) -> None:
        self.rank = 4
        self.codec = CODEC
        self.methods: dict[str, Any] = {}
        self.read_only: set[str] = set()
        self.threaded: set[str] = set()
        self.control: set[str] = set()
        self.running: dict[int, tuple[str, float]] = {}

    def register(self, name: str, fn: Any, *, read_only: bool = False,
                 threaded: bool = False, control: bool = False) -> None:
        self.methods[name] = fn
        if read_only:
            self.read_only.add(name)
        if threaded:
            self.threaded.add(name)
        if control:
            self.control.add(name)


def ledger() -> tuple[OperationLedger, list[int]]:
    calls: list[int] = []

    def bump(req: Bump) -> int:
        calls.append(req.by)
        return sum(calls)

    def boom() -> None:
        raise RuntimeError("boom")

    led = OperationLedger({"bump": bump, "boom": boom}, max_operations=2)
    led.install(FakeEndpoint())  # type: ignore[arg-type]
    return led, calls


def step(op: str, name: str, fence: int, method: str = "bump", arg: Any = None,
         phase: str = "apply", index: int | None = None) -> StepRequest:
    """A step; forward steps named "a", "b", "c"... sit at positions 0, 1, 2..."""
    if index is None:
        index = ord(name) - ord("a") if len(name) == 1 and name <= "w" else 0
    return StepRequest(op, name, phase, fence, f"{op}:{name}" + (":undo" if phase != "apply"
                                                                 else ""),
                       method, CODEC.encode_value(arg if arg is not None else Bump(1)), index)


def test_the_ledger_declares_its_reads_read_only_and_its_steps_not() -> None:
    endpoint = FakeEndpoint()
    OperationLedger({"bump": lambda arg: arg}).install(endpoint)  # type: ignore[arg-type]
    assert endpoint.read_only == {"ctlwire.last_operation", "ctlwire.step_methods"}
    assert {"ctlwire.step", "ctlwire.take_over"} <= set(endpoint.methods) - endpoint.read_only
    # served apart from the steps, never queued behind data
    assert endpoint.threaded == endpoint.control == {"ctlwire.take_over", "ctlwire.abort_step"}


def test_a_key_runs_once_and_replays_its_result() -> None:
    led, calls = ledger()
    assert led.step(step("op", "a", 5)) == 1
    assert led.step(step("op", "a", 5)) == 1
    assert calls == [1] and led.counters["replayed"] == 1 and led.runs == {"bump": 1}
    assert led.step(step("op", "b", 5, arg=Bump(2))) == 3
    last = led.last_operation()
    assert (last.rank, last.op, last.step, last.fence, last.applied) == (4, "op", "b", 5,
                                                                          ["a", "b"])


def test_an_older_fence_is_refused_and_does_not_run() -> None:
    led, calls = ledger()
    led.step(step("new", "a", 9))
    with pytest.raises(EngineFenced) as info:
        led.step(step("old", "a", 8))
    assert type(info.value).__name__ == "Fenced" and info.value.code == 409
    assert calls == [1] and led.counters["fenced"] == 1 and led.highest_fence == 9
    led.step(step("newer", "a", 10))
    assert led.highest_fence == 10


def test_a_failed_step_is_not_recorded_and_its_retry_runs() -> None:
    led, _ = ledger()
    for _ in range(2):
        with pytest.raises(RuntimeError):
            led.step(step("op", "x", 1, method="boom"))
    assert led.counters["step_errors"] == 2 and led.last_operation().op == ""
    with pytest.raises(UnknownStepMethod):
        led.step(step("op", "y", 1, method="getattr"))


def test_no_forward_step_replays_after_a_compensation() -> None:
    led, calls = ledger()
    led.step(step("op", "a", 1))
    led.step(step("op", "a", 1, phase="compensate", arg=Bump(-1)))
    with pytest.raises(OperationAborted):
        led.step(step("op", "a", 1))
    assert calls == [1, -1]
    assert led.last_operation().applied == ["a", "a:undo"]


def test_the_operations_remembered_are_bounded() -> None:
    led, calls = ledger()  # remembers 2 operations
    for op in ("p", "q", "r"):
        led.step(step(op, "a", 1))
    assert led.metrics()["operations"] == 2
    led.step(step("q", "a", 1))  # remembered: replays
    assert len(calls) == 3
    led.step(step("p", "a", 1))  # forgotten: begins anew
    assert len(calls) == 4


def test_classify_maps_every_typed_error() -> None:
    assert classify(None)[0] is StepOutcome.OK
    assert classify(Fenced("Fenced", "old", 409))[0] is StepOutcome.FENCED
    assert classify(NotDelivered(1))[0] is StepOutcome.NOT_DELIVERED
    assert classify(OutcomeUnknown(1))[0] is StepOutcome.UNKNOWN
    assert classify(RequestTimedOut("m", 1.0))[0] is StepOutcome.UNKNOWN
    assert classify(RemoteError("ValueError", "no", 0))[0] is StepOutcome.ERROR


anyio_test = pytest.mark.anyio


@anyio_test
async def test_progress_is_observable_while_the_operation_runs() -> None:
    async with EngineHarness(ranks=2, setup=lambda ep: register(ep)) as h:
        runner = OperationRunner(h.client)
        snapshots: list[dict[str, Any]] = []

        def watch(ev: ProgressEvent) -> None:
            if ev.state is RankState.APPLIED and ev.rank == 1:
                snapshots.append(runner.progress())

        result = await runner.run(weight_update_plan(1, 0), on_progress=watch)
        assert result.ok
        assert [next(iter(s.values()))["step"] for s in snapshots] == [
            "pause", "update", "resume", "(postcondition)"]
        assert all(next(iter(s.values()))["state"] == "running" for s in snapshots)
        assert runner.progress() == {}


@anyio_test
async def test_a_failing_compensation_quarantines_the_rank() -> None:
    async with EngineHarness(ranks=3, setup=lambda ep: register(ep)) as h:
        runner = OperationRunner(h.client)
        await h.client.call("arm_fault", Fault("update_weights"), rank=0)
        await h.client.call("arm_fault", Fault("restore_weights"), rank=2)
        result = await runner.run(weight_update_plan(1, 0))
        assert result.state is OperationState.DEGRADED, result.summary()
        assert result.failed_ranks == (0, 2) and result.quarantined == (2,)
        assert result.compensated == (0, 1)
        assert result.ranks[2].failed_step == "update:undo"
        assert runner.routable_ranks() == (0, 1)
        with pytest.raises(ReleaseRefused, match="paused"):
            await runner.release(2)  # still paused: its post-condition does not hold
        assert (await runner.release(2, force=True)).step == "update:undo"
        with pytest.raises(KeyError):
            await runner.release(2)
        assert runner.metrics()["released"] == 1


@anyio_test
async def test_a_stopped_engine_is_quarantined() -> None:
    async with EngineHarness(ranks=2, setup=lambda ep: register(ep),
                             client_kwargs={"default_timeout": 2.0}) as h:
        runner = OperationRunner(h.client)
        plan = OperationPlan("two", (
            OperationStep("pause", "pause", compensation=StepCall("resume")),
            OperationStep("resume", "resume"),
        ))
        h.stop_engine(1)
        # gone before the first step: nothing applied there, nothing to undo
        result = await runner.run(plan)
        assert result.state is OperationState.ABORTED, result.summary()
        assert result.ranks[1].state is RankState.ABORTED and result.failed_ranks == (1,)
        assert result.compensated == (0,)
        await h.start_engine(1)
        await h.client.wait_ready(timeout=5)

        def stop_after_pause(ev: ProgressEvent) -> None:
            if ev.step == "pause" and ev.state is RankState.APPLIED and ev.rank == 1:
                h.stop_engine(1)

        # gone after its pause applied: the pause cannot be undone there
        result = await runner.run(plan, on_progress=stop_after_pause)
        assert result.state is OperationState.DEGRADED, result.summary()
        assert result.quarantined == (1,) and result.compensated == (0,)
        assert result.ranks[1].applied == ("pause",) and result.ranks[1].undone == ()
        with pytest.raises(ValueError):
            await runner.run(plan, ranks=(1,))
        with pytest.raises(ValueError):
            await runner.run(plan, ranks=(7,))


@anyio_test
async def test_quarantine_is_visible_in_the_snapshot_and_prometheus() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    CollectorRegistry = prometheus_client.CollectorRegistry

    from ctlwire.kernel.observability.metrics import PrometheusExporter, snapshot

    async with EngineHarness(ranks=2, setup=lambda ep: register(ep)) as h:
        runner = OperationRunner(h.client)
        await h.client.call("arm_fault", Fault("update_weights"), rank=1)
        result = await runner.run(weight_update_plan(1, 0, quarantine_on_error=True))
        assert result.quarantined == (1,)
        snap = snapshot(h.client, operations=runner)
        assert snap["operations"]["quarantined"] == {
            1: {"op": result.op_id, "step": "update", "detail": result.ranks[1].detail}}
        assert snap["operations"]["routable"] == [0] and snap["operations"]["degraded"] == 1
        registry = CollectorRegistry()
        PrometheusExporter(h.client, operations=runner).register(registry)
        # the operation id is no label (unbounded): the snapshot has it
        assert registry.get_sample_value("ctlwire_rank_quarantined", {"rank": "1"}) == 1
        assert registry.get_sample_value("ctlwire_operations_total", {"state": "degraded"}) == 1
        await runner.release(1, force=True)
        assert registry.get_sample_value("ctlwire_rank_quarantined", {"rank": "1"}) is None


@anyio_test
async def test_a_compensated_operation_cannot_be_replayed_forward() -> None:
    async with EngineHarness(ranks=2, setup=lambda ep: register(ep)) as h:
        runner = OperationRunner(h.client)
        plan = weight_update_plan(1, 0)
        await h.client.call("arm_fault", Fault("update_weights"), rank=1)
        first = await runner.run(plan)
        assert first.state is OperationState.ABORTED
        before = (await h.client.fan_out("op_counts", mode="concurrent")).results
        recovery = await runner.recover(plan)
        assert recovery is not None and recovery.op_id == first.op_id
        assert recovery.compensated and not recovery.complete
        again = await runner.run(plan, op_id=recovery.op_id, fence=recovery.fence)
        assert again.state is OperationState.ABORTED, again.summary()
        assert all("OperationAborted" in rep.detail for rep in again.ranks.values())
        after = (await h.client.fan_out("op_counts", mode="concurrent")).results
        assert {r: n["runs"] for r, n in after.items()} == {
            r: n["runs"] for r, n in before.items()}  # nothing ran again


def test_malformed_steps_are_refused_without_running_or_raising_the_fence() -> None:
    led, calls = ledger()
    led.step(step("op", "a", 5))
    bad = [
        StepRequest("op", "b", "rollback", 5, "op:b", "bump", CODEC.encode_value(Bump(1)), 1),
        StepRequest("op", "b", "apply", 0, "op:b", "bump", CODEC.encode_value(Bump(1)), 1),
        StepRequest("op", "b", "apply", 2**63 - 1, "op:b", "bump",
                    CODEC.encode_value(Bump(1)), 1),
        StepRequest("op", "b", "apply", 6, "other:b", "bump", CODEC.encode_value(Bump(1)), 1),
        StepRequest("op", "b", "apply", 6, "op:b", "bump", CODEC.encode_value(Bump(1))),
    ]
    for req in bad:
        with pytest.raises(InvalidStep):
            led.step(req)
    with pytest.raises(StepOutOfOrder):
        led.step(step("op", "c", 6))  # b has not applied here
    with pytest.raises(StepOutOfOrder):
        led.step(step("new", "b", 6))  # an operation begins with its first step
    with pytest.raises(StepNotApplied):
        led.step(step("ghost", "a", 6, phase="compensate"))
    assert calls == [1] and led.highest_fence == 5 and led.counters["refused"] == 8


def test_a_compensation_runs_once_and_only_for_what_applied() -> None:
    led, calls = ledger()
    led.step(step("op", "a", 5))
    led.step(step("op", "b", 5))
    with pytest.raises(StepNotApplied):
        led.step(step("op", "c", 5, phase="compensate"))
    assert led.step(step("op", "b", 5, phase="compensate", arg=Bump(-1))) == 1
    assert led.step(step("op", "b", 5, phase="compensate", arg=Bump(-1))) == 1  # replayed
    assert calls == [1, 1, -1]
    last = led.last_operation()
    assert (last.steps, last.undone, last.applied) == (["a", "b"], ["b"], ["a", "b", "b:undo"])


def test_an_operation_is_bound_to_its_connection_until_a_newer_fence_takes_it_over() -> None:
    """The owner is the connection a step came on (what the engine's inbound core
    names as its peer), not the ``client`` field its request carries: a peer that
    copies the controller's client number and fence is still another peer, and the
    controller's own connection stays the owner whatever number it sends."""
    from types import SimpleNamespace

    from ctlwire.kernel.engine.liveness import _current_request

    led, calls = ledger()
    live = SimpleNamespace(peer_of=lambda route, client: route)  # the inbound core's peer()

    def as_peer(route: bytes, req: StepRequest, client: int = 7) -> Any:
        token = _current_request.set((live, client << 32 | 1, route, client))  # type: ignore[arg-type]
        try:
            return led.step(req)
        finally:
            _current_request.reset(token)

    as_peer(b"A", step("op", "a", 5))
    with pytest.raises(OperationOwned):  # the controller's own client number, copied
        as_peer(b"B", step("op", "a", 5, phase="compensate", arg=Bump(-1)))
    with pytest.raises(OperationOwned):
        as_peer(b"C", step("op", "a", 5, phase="compensate", arg=Bump(-1)), client=8)
    assert as_peer(b"A", step("op", "a", 5), client=9) == 1  # its own connection: replayed
    assert as_peer(b"B", step("op", "a", 6), client=8) == 1  # a successor: replays, takes over
    with pytest.raises(EngineFenced):
        as_peer(b"A", step("op", "b", 5))  # the old controller is fenced out
    assert as_peer(b"B", step("op", "b", 6), client=8) == 2
    assert calls == [1, 1] and led.counters["taken_over"] == 1


@anyio_test
async def test_async_steps_are_awaited_and_recorded_only_after_they_return() -> None:
    import anyio

    ran: list[int] = []

    async def load(req: Bump) -> int:
        await anyio.sleep(0)
        if req.by < 0:
            raise ValueError("bad weights")
        ran.append(req.by)
        return req.by

    led = OperationLedger({"load": load})
    ep = FakeEndpoint()
    led.install(ep)  # type: ignore[arg-type]
    assert ep.methods["ctlwire.step"] == led.step_async
    with pytest.raises(ValueError):
        await led.step_async(step("op", "a", 5, method="load", arg=Bump(-1)))
    assert led.last_operation().op == "" and ran == []
    assert await led.step_async(step("op", "a", 5, method="load", arg=Bump(3))) == 3
    assert ran == [3] and led.last_operation().steps == ["a"]
    with pytest.raises(InvalidStep, match="async"):
        led.step(step("op2", "a", 5, method="load"))  # served inline: refused, not skipped


def test_a_payload_that_does_not_decode_is_an_invalid_step() -> None:
    led, calls = ledger()
    for raw in (b"\xc1", CODEC.encode_value("not a Bump")):
        with pytest.raises(InvalidStep):
            led.step(StepRequest("op", "a", "apply", 5, "op:a", "bump", msgspec.Raw(raw), 0))
    assert calls == [] and led.highest_fence == 0


def test_step_handlers_are_read_like_methods_as_the_ledger_is_built() -> None:
    """A payload type defined in the scope building the ledger is resolved and
    validated (never silently Any); an annotation nothing resolves, or a handler
    requiring two arguments, is refused when the ledger is built."""

    class Scale(msgspec.Struct, frozen=True):
        factor: int

    seen: list[int] = []

    def scale(req: Scale) -> int:
        seen.append(req.factor)
        return req.factor

    led = OperationLedger({"scale": scale})
    led.install(FakeEndpoint())  # type: ignore[arg-type]
    with pytest.raises(InvalidStep):
        led.step(step("op", "a", 5, "scale", Bump(2)))  # a Bump is not a Scale
    assert led.step(step("op", "a", 5, "scale", Scale(3))) == 3 and seen == [3]

    def unresolved(req: NoSuchType) -> None:  # type: ignore[name-defined]  # noqa: F821
        pass

    with pytest.raises(TypeError, match="NoSuchType"):
        OperationLedger({"unresolved": unresolved})

    def two(a: int, b: int) -> None:
        pass

    with pytest.raises(TypeError, match="at most one argument"):
        OperationLedger({"two": two})


def test_a_take_over_fences_older_controllers_before_it_answers() -> None:
    led, calls = ledger()
    led.step(step("op", "a", 5))
    last = led.take_over(TakeOver(9))
    assert (last.op, last.steps, led.highest_fence) == ("op", ["a"], 9)
    with pytest.raises(EngineFenced):
        led.step(step("op", "b", 5))  # the old controller, after the take-over
    with pytest.raises(EngineFenced):
        led.take_over(TakeOver(8))
    with pytest.raises(InvalidStep):
        led.take_over(TakeOver(2**63 - 1))
    assert led.step(step("op", "b", 9)) == 2 and calls == [1, 1]


def test_last_operation_read_on_another_thread_is_one_consistent_view() -> None:
    """A BusyLoop answers ``ctlwire.last_operation`` on its I/O thread while steps are
    recorded on the loop's thread: every answer is the state after some whole step."""
    led, _ = ledger()
    led.max_operations = 1000
    torn: list[object] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            last = led.last_operation()
            if last.op and (last.applied[-1] != last.step or last.steps != last.applied):
                torn.append(last)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    reader = threading.Thread(target=read)
    reader.start()
    try:
        for n in range(400):
            for name in "abcdefghij":
                led.step(step(f"op{n}", name, 5))
    finally:
        done.set()
        reader.join()
        sys.setswitchinterval(switch)
    assert torn == []
    assert led.last_operation().applied == list("abcdefghij")
