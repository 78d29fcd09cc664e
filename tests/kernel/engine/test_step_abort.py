"""Aborting a running operation step (``ctlwire.abort_step``): who may, what it changes,
and the runner asking the other ranks of a step to abort it once one was lost."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from ctlwire.kernel.core.operation_plan import OperationPlan, OperationStep
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.engine.liveness import _current_request
from ctlwire.kernel.engine.operation_ledger import (
    ABORT_STEP_METHOD,
    TAKE_OVER_METHOD,
    AbortStep,
    OperationLedger,
    OperationOwned,
    StepRequest,
    step_aborted,
)
from ctlwire.kernel.engine.step_refusals import Fenced
from ctlwire.kernel.errors import OutcomeUnknown
from ctlwire.kernel.operations.runner import OperationRunner
from ctlwire.states import OperationState, RankState
from ctlwire.testing import EngineHarness
from ctlwire.transports.codec import MsgpackCodec

CODEC = MsgpackCodec()
LIVE = SimpleNamespace(peer_of=lambda route, client: route)  # the inbound core's peer()


class Aborted(Exception):
    pass


def waiting_ledger() -> tuple[OperationLedger, threading.Event]:
    """A ledger whose step ``wait`` runs until it is aborted (10 s at most)."""
    started = threading.Event()

    def wait() -> str:
        started.set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if step_aborted():
                raise Aborted("aborted")
            time.sleep(0.005)
        return "ran to its end"

    led = OperationLedger({"wait": wait})
    endpoint = SimpleNamespace(rank=3, codec=CODEC, running={},
                               register=lambda *args, **kwargs: None)
    led.install(endpoint)  # type: ignore[arg-type]
    return led, started


def as_peer(route: bytes, fn: Any, *args: Any) -> Any:
    token = _current_request.set((LIVE, 1, route, 0))  # type: ignore[arg-type]
    try:
        return fn(*args)
    finally:
        _current_request.reset(token)


def run_step(led: OperationLedger, route: bytes, req: StepRequest
             ) -> tuple[list[Any], threading.Thread]:
    """Run ``req`` from peer ``route`` on a thread; its outcome lands in the list."""
    outcome: list[Any] = []

    def body() -> None:
        try:
            outcome.append(as_peer(route, led.step, req))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return outcome, thread


def wait_step(op: str, fence: int) -> StepRequest:
    return StepRequest(op, "w", "apply", fence, f"{op}:w", "wait", CODEC.encode_value(None), 0)


def test_the_abort_is_served_apart_from_the_steps() -> None:
    """Threaded (a busy loop serves it beside its steps) and control (serve() runs it
    as it arrives, never queued): the abort and the take-over, not the steps."""
    seen: dict[str, tuple[bool, bool]] = {}
    endpoint = SimpleNamespace(rank=0, codec=CODEC, running={}, register=lambda name, fn, *,
                               read_only=False, threaded=False, control=False:
                               seen.__setitem__(name, (threaded, control)))
    OperationLedger({"wait": lambda: None}).install(endpoint)  # type: ignore[arg-type]
    assert seen[ABORT_STEP_METHOD] == seen[TAKE_OVER_METHOD] == (True, True)
    assert seen["ctlwire.step"] == (False, False)


def test_only_the_steps_own_controller_aborts_it_and_the_step_fails_unrecorded() -> None:
    led, started = waiting_ledger()
    fence = time.time_ns() // 1000
    outcome, thread = run_step(led, b"A", wait_step("op", fence))
    assert started.wait(5)
    with pytest.raises(OperationOwned):  # another connection, the same numbers
        as_peer(b"B", led.abort_step, AbortStep("op", "w", "apply", fence))
    with pytest.raises(OperationOwned):  # its connection, another token
        as_peer(b"A", led.abort_step, AbortStep("op", "w", "apply", fence + 1))
    with pytest.raises(Fenced):  # older than what this rank accepted
        as_peer(b"A", led.abort_step, AbortStep("op", "w", "apply", fence - 1))
    # another step, phase or operation than the one running: nothing to abort
    for other in (AbortStep("op", "x", "apply", fence), AbortStep("op", "w", "compensate", fence),
                  AbortStep("op2", "w", "apply", fence)):
        assert as_peer(b"A", led.abort_step, other) is False
    assert not outcome and led.counters["aborts"] == 0  # still running
    assert as_peer(b"A", led.abort_step, AbortStep("op", "w", "apply", fence)) is True
    thread.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], Aborted), outcome
    assert led.counters["aborts"] == 1 and led.last_operation().op == ""  # not recorded
    # the step no longer runs: a late abort changes nothing
    assert as_peer(b"A", led.abort_step, AbortStep("op", "w", "apply", fence)) is False
    assert not step_aborted()  # outside a step


@pytest.mark.anyio
async def test_a_rank_lost_mid_step_makes_the_runner_abort_the_others() -> None:
    """Three ranks block in one step (a collective) until aborted; rank 1 is lost: its
    part ends at once (OutcomeUnknown), the others are aborted, long before the step's
    timeout, and nothing of the step applied."""
    started: dict[int, anyio.Event] = {}
    ledgers: dict[int, OperationLedger] = {}

    def setup(ep: EngineEndpoint) -> None:
        rank = ep.rank
        started[rank] = anyio.Event()

        async def collect() -> str:
            started[rank].set()
            with anyio.move_on_after(20):
                while not step_aborted():
                    await anyio.sleep(0.01)
                raise Aborted(f"rank {rank}: the collective was aborted")
            return "ran to its end"

        ledgers[rank] = OperationLedger({"collect": collect})
        ledgers[rank].install(ep)

    plan = OperationPlan("collective", (OperationStep("collect", "collect", None, 30.0),))
    async with EngineHarness(ranks=3, setup=setup) as h:
        runner = OperationRunner(h.client)
        result: Any = None

        async def run() -> None:
            nonlocal result
            result = await runner.run(plan)

        start = anyio.current_time()
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            for rank in range(3):
                await started[rank].wait()
            h.stop_engine(1)
        assert anyio.current_time() - start < 15  # bounded by liveness, not the timeout
        assert result.state is OperationState.ABORTED, result.summary()
        assert isinstance(result.ranks[1].error, OutcomeUnknown), result.ranks[1]
        for r in (0, 2):
            rep = result.ranks[r]
            assert rep.state is RankState.ABORTED and rep.applied == (), rep
            assert "the collective was aborted" in rep.detail, rep.detail
        assert [ledgers[r].counters["aborts"] for r in (0, 2)] == [1, 1]
