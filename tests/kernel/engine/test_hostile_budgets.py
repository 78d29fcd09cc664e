"""What one peer with a raw DEALER and no key can take from an engine that binds
(real engine processes over ipc): not its ears (a flood of one busy method), not
the others' share of the idempotency cache, not an operation another controller
began. Counts and outcomes are asserted, never durations; every wait is a bound
that a deaf or stolen engine would exceed."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
from raw_peer import CODEC, METRICS, RawPeer, attacker, engine, error_type, ipc, value

from ctlwire.app.operation_engine import RestoreWeights, weight_update_plan
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.core.operation_plan import step_key
from ctlwire.kernel.core.operation_result import ProgressEvent
from ctlwire.kernel.engine.operation_ledger import (
    LAST_OPERATION_METHOD,
    STEP_METHOD,
    LastOperation,
    StepRequest,
)
from ctlwire.kernel.operations.runner import OperationRunner
from ctlwire.states import OperationState, RankState
from ctlwire.transports.envelope import Reply
from ctlwire.transports.zmq_client import ZmqDealerClientTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

OPERATIONS = ["--methods", "ctlwire.app.operation_engine:register"]
ANSWER = 10.0  # what a live engine answers well within; a deaf one never does


def controller(address: str, **kw: Any) -> ControlClient:
    return ControlClient(ZmqDealerClientTransport([address]), ranks=1, **kw)


def collect(peer: RawPeer, count: int, timeout: float = 30.0) -> list[Reply]:
    """The next ``count`` replies, whatever their ids; fails on a timeout."""
    got: list[Reply] = []
    end = time.monotonic() + timeout
    while len(got) < count:
        left = end - time.monotonic()
        assert left > 0, f"{len(got)} of {count} replies"
        if peer.sock.poll(int(left * 1000)):
            env = CODEC.decode(peer.sock.recv())
            if type(env) is Reply:
                got.append(env)
    return got


# -- one busy method cannot make the engine deaf --------------------------------------------


async def test_a_flood_of_one_busy_method_leaves_the_engine_answering(
        tmp_path: Any, raw_peer: list[RawPeer], anyio_backend: str) -> None:
    """A handler that never returns runs (``hang``, async, serve mode). The peer
    sends 600 more ``hang`` requests with junk payloads and 1 s deadlines, then
    100 valid ones. The engine keeps receiving: the junk is refused as it
    arrives, the valid ones beyond the connection's share are refused ``Busy``
    (counted), and the peer's own ``echo`` and ``ctlwire.metrics``, a new
    controller's ``echo`` and another async method are answered at once."""
    address = ipc(tmp_path)
    with engine(address, "serve", ["--backend", anyio_backend]):
        bad = attacker(raw_peer, address)
        bad.send("hang")  # runs for ever: the method's one worker is taken
        deadline = time.time() + 1.0
        junk = [bad.send("hang", value({"junk": n}), deadline=deadline) for n in range(600)]
        valid = [bad.send("hang") for _ in range(100)]
        assert bad.call("echo", value("still here"), timeout=ANSWER).result == value(
            "still here")
        metrics = bad.metrics(timeout=ANSWER)
        async with controller(address) as c:
            assert await c.call("echo", "controller", timeout=ANSWER) == "controller"
            assert await c.call("nap", 0.01, timeout=ANSWER) == 0.01
        share = metrics["queued_requests"]["limit_per_route"]
        answered = bad.replies(set(junk) | set(valid[share:]), timeout=ANSWER)
        counters = bad.metrics(timeout=ANSWER)["counters"]
    print(f"\n{anyio_backend}: junk refused as {sorted({error_type(answered[i]) for i in junk})}, "
          f"busy {counters['busy']}, queued {metrics['queued_requests']}")
    assert {error_type(answered[i]) for i in junk} <= {"InvalidPayload", "DeadlineExpired"}
    assert {error_type(answered[i]) for i in valid[share:]} == {"Busy"}
    assert {answered[i].error.code for i in valid[share:]} == {429}  # type: ignore[union-attr]
    assert metrics["queued_requests"]["requests"] == share
    assert counters["busy"] == len(valid) - share
    assert counters["rejected"] >= len(junk) + len(valid) - share


# -- the idempotency cache: a share per connection, no key for what was refused -----------


@pytest.mark.parametrize("mode", ["poll", "serve"])
async def test_a_flood_of_keys_fills_only_its_own_connections_share(
        mode: str, tmp_path: Any, raw_peer: list[RawPeer]) -> None:
    """A peer sends 4,200 keyed requests (more than the cache's 4,096 entries): it
    fills its own share and the rest is refused ``CacheFull``; a controller on
    its own connection still runs its keyed call, and its retry replays it."""
    address = ipc(tmp_path)
    with engine(address, mode):
        bad = attacker(raw_peer, address)
        replies: dict[int, Reply] = {}
        for start in range(0, 4200, 500):  # read as it goes: unread replies are bounded
            ids = {bad.send("echo", value(n), key=f"flood-{n}")
                   for n in range(start, min(start + 500, 4200))}
            replies.update(await anyio.to_thread.run_sync(bad.replies, ids))
        async with controller(address) as c:
            assert await c.call("mark", "once", timeout=ANSWER, idempotency_key="w7") == 1
            assert await c.call("mark", "once", timeout=ANSWER, idempotency_key="w7") == 1
            assert await c.call("marks", timeout=ANSWER) == ["once"]
        cache = bad.metrics()["idempotency_cache"]
    refused = [r for r in replies.values() if not r.ok]
    print(f"\n{mode}: flood refused {len(refused)}/4200; cache {cache}")
    assert {error_type(r) for r in refused} == {"CacheFull"}
    assert len(refused) == 4200 - cache["max_entries_per_owner"]
    assert cache["entries"] == cache["max_entries_per_owner"] + 1 and cache["owners"] == 2


@pytest.mark.parametrize("mode", ["poll", "serve"])
async def test_refused_operation_steps_hold_no_key(
        mode: str, tmp_path: Any, raw_peer: list[RawPeer]) -> None:
    """A peer sends 4,200 keyed ``ctlwire.step`` requests the ledger refuses
    (``InvalidStep``): none is recorded under its key, and a controller's
    operation, its steps keyed in the envelope, commits."""
    address = ipc(tmp_path)
    with engine(address, mode, OPERATIONS):
        bad = attacker(raw_peer, address)
        step = CODEC.encode_value({"op": "x@1", "step": "pause", "phase": "rollback",
                                   "fence": 1, "key": "x@1:pause", "method": "pause",
                                   "args": None})
        for start in range(0, 4200, 500):
            ids = {bad.send(STEP_METHOD, step, key=f"planted-{n}")
                   for n in range(start, min(start + 500, 4200))}
            replies = await anyio.to_thread.run_sync(bad.replies, ids)
            assert {error_type(r) for r in replies.values()} == {"InvalidStep"}
        assert bad.metrics()["idempotency_cache"]["entries"] == 0
        async with controller(address) as c:
            await c.wait_ready(timeout=ANSWER)
            result = await OperationRunner(c, envelope_fields=True).run(
                weight_update_plan(1, 0))
            assert result.ok and result.state is OperationState.COMMITTED, result.summary()
        cache = bad.metrics()["idempotency_cache"]
    print(f"\n{mode}: cache after the flood and an operation: {cache}")
    assert cache["refused_full"] == 0 and cache["entries"] == 3  # the operation's steps


# -- an operation belongs to the connection that began it ------------------------------------


class ControllerStops(Exception):
    pass


@pytest.mark.parametrize("mode", ["poll", "serve"])
async def test_a_peer_with_the_controllers_ids_and_fence_cannot_step_its_operation(
        mode: str, tmp_path: Any, raw_peer: list[RawPeer]) -> None:
    """A controller's operation stops after its update step (paused, new weights,
    not resumed). A peer reads the op id and fence (``ctlwire.last_operation``),
    is given the controller's own client incarnation (as if read off an id), and
    sends the compensation ``restore_weights(666)`` under the controller's fence
    with request ids and ``client`` of the controller's: refused
    ``OperationOwned``, nothing runs. The controller, still connected, finishes
    its operation through the take-over path."""
    address = ipc(tmp_path)
    plan = weight_update_plan(1, 0)

    def stop_after_update(ev: ProgressEvent) -> None:
        if ev.step == "update" and ev.state is RankState.APPLIED:
            raise ControllerStops

    with engine(address, mode, OPERATIONS):
        bad = attacker(raw_peer, address)
        async with controller(address, default_timeout=ANSWER) as c:
            await c.wait_ready(timeout=ANSWER)
            runner = OperationRunner(c)
            with pytest.raises(ControllerStops):
                await runner.run(plan, on_progress=stop_after_update)
            reply = bad.call(LAST_OPERATION_METHOD)
            last = CODEC.decode_value(reply.result, LastOperation)
            assert last.steps == ["pause", "update"] and last.fence
            inc = c.registry.incarnation
            forged = StepRequest(last.op, "update", "compensate", last.fence,
                                 step_key(last.op, "update", True), "restore_weights",
                                 CODEC.encode_value(RestoreWeights(666)), 1, [0])
            stolen = bad.call(STEP_METHOD, CODEC.encode_value(forged),
                              id=(inc << 32) | 999_999, client=inc)
            assert error_type(stolen) == "OperationOwned"
            info = await c.call("get_server_info", timeout=ANSWER)
            assert (info["version"], info["paused"]) == (1, True)
            assert "restore_weights" not in (await c.call("op_counts", timeout=ANSWER))["runs"]
            recovery = await runner.recover(plan)
            assert recovery is not None and recovery.op_id == last.op
            result = await runner.finish(plan, recovery)
            assert result.ok and result.state is OperationState.COMMITTED, result.summary()
            info = await c.call("get_server_info", timeout=ANSWER)
        assert (info["version"], info["paused"]) == (1, False)


async def test_metrics_show_a_peer_no_other_connections_request_ids(
        tmp_path: Any, raw_peer: list[RawPeer], anyio_backend: str) -> None:
    """While a controller's request runs (serve mode: requests run concurrently),
    ``ctlwire.metrics`` counts it for every caller but lists its id only to the
    controller's own connection."""
    address = ipc(tmp_path)
    with engine(address, "serve", ["--backend", anyio_backend]):
        bad = attacker(raw_peer, address)
        async with controller(address) as c:
            await c.wait_ready(timeout=ANSWER)
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: c.call("nap", 60.0, timeout=120))
                with anyio.fail_after(ANSWER):
                    while True:  # until the engine runs it
                        seen = await anyio.to_thread.run_sync(bad.metrics)
                        if seen["live_requests"] > 1:
                            break
                        await anyio.sleep(0.01)
                (rid,) = [r.id for r in c.registry.live()]
                own = await c.engine_metrics(0, timeout=ANSWER)
                tg.cancel_scope.cancel()
    print(f"\nthe peer sees running {seen['running']} of {seen['live_requests']}; "
          f"the controller sees {own['running']}")
    assert rid not in seen["running"] and set(seen["running"].values()) == {METRICS}
    assert own["running"].get(rid) == "nap" and len(own["running"]) == 2
