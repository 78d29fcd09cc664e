"""The reference engine against sentences of ``docs/protocol.md`` that only a
request arriving while another runs can show: a repeated idempotency key, a
take-over during a step (real engine processes over ipc,
a raw peer that knows the wire format and nothing else)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from raw_peer import CODEC, RawPeer, attacker, engine, error_type, ipc, value

from ctlwire.app.operation_engine import Pause, UpdateWeights
from ctlwire.kernel.core.fencing import new_fence
from ctlwire.kernel.core.operation_plan import step_key
from ctlwire.kernel.engine.operation_ledger import (
    LAST_OPERATION_METHOD,
    STEP_METHOD,
    TAKE_OVER_METHOD,
    LastOperation,
    StepRequest,
    TakeOver,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

ANSWER = 10.0  # what a live engine answers well within
LONG = 60.0  # a first run that outlasts the test


@pytest.mark.parametrize("first", ["running", "waiting"])
async def test_a_repeated_key_is_answered_in_progress_at_once(
        first: str, tmp_path: Any, raw_peer: list[RawPeer], anyio_backend: str) -> None:
    """Idempotency keys: "A repeat while the first still runs gets ``InProgress``
    (425)" -- at once, not the first run's outcome once it ends. The first run
    is running (a long ``nap``), or waiting to start behind one (a method runs
    one request at a time); either way the repeat is answered before the first."""
    address = ipc(tmp_path)
    with engine(address, "serve", ["--backend", anyio_backend]):
        peer = attacker(raw_peer, address)
        if first == "waiting":
            peer.send("nap", value(LONG))  # the method's one worker is taken
            peer.send("nap", value(0.0), key="k")
        else:
            assert peer.call("nap", value(0.0), timeout=ANSWER).ok  # its lane is open
            peer.send("nap", value(LONG), key="k")
        repeat = peer.send("nap", value(LONG), key="k")
        reply = peer.replies({repeat}, timeout=ANSWER)[repeat]
        assert error_type(reply) == "InProgress" and reply.error is not None
        assert reply.error.code == 425
        assert not peer.unclaimed  # the first run has not been answered
        counters = peer.metrics(timeout=ANSWER)["counters"]
    assert counters["idempotent_in_progress"] == 1


@pytest.mark.parametrize(("mode", "steps"), [("loop", "register"), ("serve", "register_async"),
                                             ("serve", "register_threaded")])
async def test_a_take_over_while_a_step_runs_is_refused_step_in_flight(
        mode: str, steps: str, tmp_path: Any, raw_peer: list[RawPeer],
        anyio_backend: str) -> None:
    """``ctlwire.take_over``: "``StepInFlight`` 409 while a step runs: ask
    again". A step of an operation runs (a long blocking weight load on a busy
    loop's thread, an async one, one in a worker thread); a successor's take-over
    is refused at once, the fence not moved, and the step is not answered yet."""
    address = ipc(tmp_path)
    methods = ["--methods", f"ctlwire.app.operation_engine:{steps}"]
    with engine(address, mode, ["--backend", anyio_backend, *methods]):
        peer = attacker(raw_peer, address)
        fence = new_fence()

        def step(name: str, index: int, method: str, args: Any) -> int:
            key = step_key("op@1", name, False)
            req = StepRequest("op@1", name, "apply", fence, key, method,
                              CODEC.encode_value(args), index, [0])
            return peer.send(STEP_METHOD, CODEC.encode_value(req), key=key, fence=fence)

        paused = step("pause", 0, "pause", Pause("drain"))
        assert peer.replies({paused}, timeout=ANSWER)[paused].ok
        update = step("update", 1, "update_weights", UpdateWeights(2, "", LONG))
        with anyio.fail_after(ANSWER):  # until the ledger runs it (named by its method)
            while peer.metrics(timeout=ANSWER)["running"].get(update) != "update_weights":
                await anyio.sleep(0.01)
        successor = new_fence()
        reply = peer.call(TAKE_OVER_METHOD, CODEC.encode_value(TakeOver(successor)),
                          fence=successor, timeout=ANSWER)
        assert error_type(reply) == "StepInFlight" and reply.error is not None
        assert reply.error.code == 409
        last = CODEC.decode_value(peer.call(LAST_OPERATION_METHOD, timeout=ANSWER).result,
                                  LastOperation)
        assert last.highest_fence == fence and last.steps == ["pause"]
        assert update not in peer.unclaimed  # the step still runs
