"""What a peer that only knows the wire format can do to an engine that binds
(real engine processes, attacked over ipc from a raw DEALER): it cannot lock
controllers out with a fence, make a legitimate request be dropped as a
duplicate, read running request ids off the beacon, make an idempotent call
run twice or read another peer's recorded outcome, or grow the idempotency
cache past its bounds. Counts and outcomes are asserted, never durations."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
import zmq
from raw_peer import (
    CODEC,
    METRICS,
    RawPeer,
    attacker,
    engine,
    error_type,
    ipc,
    value,
)

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.core.fencing import new_fence
from ctlwire.kernel.core.peer_table import Progress
from ctlwire.kernel.errors import Fenced, RequestTimedOut
from ctlwire.transports.envelope import Heartbeat, Reply
from ctlwire.transports.zmq_client import ZmqDealerClientTransport

pytestmark = [pytest.mark.timeout(240)]

# -- fences -----------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["poll", "serve"])
async def test_no_single_frame_fence_locks_controllers_out(
        mode: str, tmp_path: Any, raw_peer: list[RawPeer]) -> None:
    """Fences of 2**64-1 sent to the read-only built-in and with an invalid
    payload, one in the wrong unit, one a minute ahead with an invalid payload:
    none moves the engine's fence, the far ones are refused as out of range
    (counted), and controllers fencing with today's clock keep working --
    while an older controller is still fenced out by a newer one."""
    address = ipc(tmp_path)
    with engine(address, mode):
        bad = attacker(raw_peer, address)
        metrics_reply = bad.call(METRICS, fence=2**64 - 1)
        assert metrics_reply.ok  # read-only: the fence is ignored
        assert error_type(bad.call("mark", value(1), fence=2**64 - 1)) == "FenceOutOfRange"
        nanos = time.time_ns()  # a token in the wrong unit
        assert error_type(bad.call("mark", value("ns"), fence=nanos)) == "FenceOutOfRange"
        soon = new_fence() + 60_000_000
        assert error_type(bad.call("mark", value(1), fence=soon)) == "InvalidPayload"
        assert bad.call(METRICS, fence=soon + 1).ok
        after_attack = bad.metrics()
        assert after_attack["fence_high"] == 0
        assert after_attack["counters"]["fence_out_of_range"] == 2

        older = ControlClient(ZmqDealerClientTransport([address]), ranks=1, fence=True)
        newer = ControlClient(ZmqDealerClientTransport([address]), ranks=1, fence=True)
        async with older, newer:
            assert await older.call("mark", "older", timeout=15) == 1
            assert await newer.call("mark", "newer", timeout=15) == 2
            with pytest.raises(Fenced):
                await older.call("mark", "older again", timeout=15)
            assert await newer.call("marks", timeout=15) == ["older", "newer"]
        final = bad.metrics()
        print(f"\n{mode}: fence_high {final['fence_high']}, counters "
              f"fenced={final['counters']['fenced']} "
              f"out_of_range={final['counters']['fence_out_of_range']}")
        assert final["fence_high"] == newer.fence
        assert final["counters"]["fenced"] == 1


# -- request ids ------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["poll", "serve"])
async def test_ids_sent_on_another_connection_never_drop_a_legitimate_call(
        mode: str, tmp_path: Any, raw_peer: list[RawPeer]) -> None:
    """A peer that knows a client's next 4,000 request ids (its incarnation and
    counter) sends them all first, claiming the client's id: every call of the
    client afterwards still runs and is answered."""
    address = ipc(tmp_path)
    with engine(address, mode):
        bad = attacker(raw_peer, address)
        async with ControlClient(ZmqDealerClientTransport([address]), ranks=1) as c:
            await c.wait_ready(timeout=15)
            inc = c.registry.incarnation
            for start in range(1, 4001, 500):  # read as it goes: unread replies are bounded
                ids = {bad.send("echo", value(n), id=(inc << 32) | n, client=inc)
                       for n in range(start, start + 500)}
                await anyio.to_thread.run_sync(bad.replies, ids)  # they ran, for the peer
            ok = 0
            for i in range(5):
                try:
                    assert await c.call("echo", f"legit {i}", timeout=10) == f"legit {i}"
                except RequestTimedOut:
                    break
                ok += 1
            engine_counters = bad.metrics()["counters"]
        print(f"\n{mode}: legitimate calls answered {ok}/5 after 4,000 pre-sent ids; "
              f"duplicates dropped {engine_counters['duplicates']}")
        assert ok == 5
        assert engine_counters["duplicates"] == 0


def beacon_heartbeats(address: str, seconds: float) -> list[Heartbeat]:
    """What any local peer that says hello to the engine's beacon (a client
    heartbeat) reads for ``seconds``."""
    ctx = zmq.Context()
    sub = ctx.socket(zmq.DEALER)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(address + ".beat")
    sub.send(CODEC.encode(Heartbeat(-1, 0, 0)))
    got: list[Heartbeat] = []
    end = time.monotonic() + seconds
    try:
        while (left := end - time.monotonic()) > 0:
            if sub.poll(int(left * 1000)):
                env = CODEC.decode(sub.recv())
                if type(env) is Heartbeat:
                    got.append(env)
    finally:
        sub.close(0)
        ctx.term()
    return got


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["poll", "serve"])
async def test_the_beacon_names_no_running_request(mode: str, tmp_path: Any) -> None:
    """While a client's call runs, a peer reading the engine's beacon learns
    that the rank is busy and with which method -- never the request's id or
    its handler's progress; the caller still sees the rank Busy."""
    address = ipc(tmp_path)
    with engine(address, mode):
        async with ControlClient(ZmqDealerClientTransport([address]), ranks=1) as c:
            await c.wait_ready(timeout=15)
            heard: list[list[Heartbeat]] = []
            states: set[str] = set()
            async with anyio.create_task_group() as tg:
                async def sniff() -> None:
                    heard.append(await anyio.to_thread.run_sync(beacon_heartbeats, address, 4.0))

                tg.start_soon(sniff)
                await anyio.sleep(0.5)
                async def call() -> None:
                    assert await c.call("slow_update", 2.5, timeout=30) >= 1

                async with anyio.create_task_group() as calls:
                    calls.start_soon(call)
                    while not heard:
                        states.add(c.peers.state(0).name)
                        await anyio.sleep(0.1)
        busy = [hb for hb in heard[0] if hb.method]
        print(f"\n{mode}: {len(heard[0])} beacon heartbeats, {len(busy)} busy; "
              f"busy ids {sorted({hb.busy for hb in busy})}")
        assert busy and all(hb.method == "slow_update" for hb in busy)
        assert all(hb.busy == 0 and hb.progress < 0 and hb.note == "" for hb in heard[0])
        assert "BUSY" in states


@pytest.mark.anyio
@pytest.mark.parametrize(("mode", "method"), [("poll", "slow_update"), ("serve", "slow_update"),
                                              ("serve", "nap_progress")])
async def test_progress_reaches_the_caller_on_its_own_route(
        mode: str, method: str, tmp_path: Any) -> None:
    """Progress that the beacon no longer carries still reaches the caller, on
    its own connection, with its request id: from a handler blocking the
    engine's thread (poll and serve) and from an async one."""
    address = ipc(tmp_path)
    seen: list[Progress] = []
    with engine(address, mode):
        async with ControlClient(ZmqDealerClientTransport([address]), ranks=1) as c:
            await c.wait_ready(timeout=15)
            await c.call(method, 2.0, timeout=30, on_progress=lambda r, p: seen.append(p))
    fractions = [p.fraction for p in seen]
    print(f"\n{mode} {method}: progress seen by the caller: {fractions}")
    assert seen and all(p.method == method and p.request_id for p in seen)
    assert fractions == sorted(fractions) and fractions[-1] > 0


# -- idempotency keys -------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["poll", "serve"])
async def test_a_key_planted_by_another_connection_neither_answers_nor_blocks_a_call(
        mode: str, tmp_path: Any, raw_peer: list[RawPeer]) -> None:
    """A peer runs ``mark`` under key "weights-v7" first: the client's call with
    that key still runs its own handler (and a second method using the same
    key runs too); the client's retry gets its own first outcome."""
    address = ipc(tmp_path)
    with engine(address, mode):
        bad = attacker(raw_peer, address)
        assert bad.call("mark", value("planted"), key="weights-v7").ok
        async with ControlClient(ZmqDealerClientTransport([address]), ranks=1) as c:
            first = await c.call("mark", "legit", timeout=15, idempotency_key="weights-v7")
            again = await c.call("mark", "legit", timeout=15, idempotency_key="weights-v7")
            echoed = await c.call("echo", "same key", timeout=15, idempotency_key="weights-v7")
            marks = await c.call("marks", timeout=15)
        assert (first, again, echoed) == (2, 2, "same key")
        assert marks == ["planted", "legit"]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["poll", "serve"])
async def test_a_flood_of_keys_cannot_evict_a_recorded_outcome(
        mode: str, tmp_path: Any, raw_peer: list[RawPeer]) -> None:
    """After a client's keyed ``mark`` ran, a peer sends 4,200 keyed requests (more
    than the cache's 4,096 entries): the excess is refused with CacheFull and
    counted, and the client's retry gets the recorded outcome -- the handler
    ran once."""
    address = ipc(tmp_path)
    with engine(address, mode):
        bad = attacker(raw_peer, address)
        async with ControlClient(ZmqDealerClientTransport([address]), ranks=1) as c:
            assert await c.call("mark", "once", timeout=15, idempotency_key="w7") == 1
            replies: dict[int, Reply] = {}
            for start in range(0, 4200, 500):  # read as it goes: unread replies are bounded
                ids = {bad.send("echo", value(n), key=f"flood-{n}")
                       for n in range(start, min(start + 500, 4200))}
                replies.update(await anyio.to_thread.run_sync(bad.replies, ids))
            assert len(replies) == 4200
            refused = [r for r in replies.values() if not r.ok]
            assert await c.call("mark", "once", timeout=15, idempotency_key="w7") == 1
            marks = await c.call("marks", timeout=15)
        cache = bad.metrics()["idempotency_cache"]
        print(f"\n{mode}: flood refused {len(refused)}/4200; cache {cache}")
        assert marks == ["once"]
        assert refused and {error_type(r) for r in refused} == {"CacheFull"}
        assert cache["refused_full"] == len(refused) and cache["evicted"] == 0
        assert cache["entries"] <= 4096 and cache["bytes"] <= cache["max_bytes"]


def test_long_keys_are_refused_and_read_only_calls_record_none(
        tmp_path: Any, raw_peer: list[RawPeer]) -> None:
    """4 MiB keys: refused (KeyTooLong) on a state-changing method, ignored by the
    read-only built-in; the cache stays empty and the handler never ran."""
    address = ipc(tmp_path)
    with engine(address, "poll"):
        bad = attacker(raw_peer, address)
        big = "k" * (4 << 20)
        for i in range(8):
            assert bad.call(METRICS, key=big + str(i)).ok
        assert error_type(bad.call("mark", value("x"), key=big)) == "KeyTooLong"
        m = bad.metrics()
        assert m["idempotency_cache"]["entries"] == 0 and m["idempotency_cache"]["bytes"] == 0
        assert m["counters"]["idempotency_key_too_long"] == 1
        assert bad.call("marks").result == value([])


@pytest.mark.anyio
async def test_a_repeat_of_a_key_whose_handler_raised_gets_the_same_error(
        tmp_path: Any) -> None:
    """The first run raised: the repeat is answered with that error (replayed,
    counted), not a success and not a second run."""
    from ctlwire.kernel.errors import RemoteError

    address = ipc(tmp_path)
    with engine(address, "poll"):
        async with ControlClient(ZmqDealerClientTransport([address]), ranks=1) as c:
            errors = []
            for _ in range(2):
                with pytest.raises(RemoteError) as info:
                    await c.call("fail", "boom once", timeout=15, idempotency_key="f1")
                errors.append((info.value.type_name, info.value.message))
            m = await c.call(METRICS, timeout=15)
    assert errors == [("RuntimeError", "boom once")] * 2
    assert m["counters"]["idempotent_replays"] == 1 and m["counters"]["handler_errors"] == 1
