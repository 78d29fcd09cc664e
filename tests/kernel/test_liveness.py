"""Busy is not dead, and failures say whether the work ran: real engine processes.

Engines heartbeat from a beacon thread with a socket of its own, so handlers
and steps that block for seconds leave the rank alive (Busy); kill -9, SIGSTOP
and a client that stalls are told apart; NotDelivered never ran, OutcomeUnknown
may have; an idempotency key makes a retry run the handler once.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import anyio
import pytest

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.core.peer_table import Progress
from ctlwire.kernel.errors import EngineDead, NotDelivered, OutcomeUnknown
from ctlwire.states import PeerState
from ctlwire.transports.zmq_client import ZmqDealerClientTransport, ZmqRouterClientTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]
METHODS = "ctlwire.app.engine_process:stepping_methods"


@pytest.fixture
def ipc_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("live")
    os.chmod(d, 0o700)
    return str(d)


def connect_fleet(address: str, modes: dict[int, str]) -> EngineFleet:
    return EngineFleet(list(modes), lambda r: ["--connect", address, "--mode", modes[r],
                                               "--methods", METHODS])


async def test_handlers_blocking_for_four_liveness_windows_are_busy_not_dead(
        ipc_dir: str) -> None:
    """A sync handler blocking 4 s (four times the client's 1 s liveness window), in
    poll mode (rank 0) and serve mode (rank 1), returns its result; the ranks are
    Busy meanwhile and never Lost; its progress reaches the caller while it blocks."""
    address = f"ipc://{ipc_dir}/c.sock"
    seen: dict[int, list[Progress]] = {0: [], 1: []}
    states: set[tuple[int, str]] = set()
    with connect_fleet(address, {0: "poll", 1: "serve"}):
        async with ControlClient(ZmqRouterClientTransport(address), ranks=2) as c:
            await c.wait_ready(timeout=15)
            result: dict[int, Any] = {}

            async def run(rank: int) -> None:
                result[rank] = await c.call("slow_update", 4.0, rank=rank, timeout=30,
                                            on_progress=lambda r, p: seen[r].append(p))

            async with anyio.create_task_group() as tg:
                for rank in (0, 1):
                    tg.start_soon(run, rank)
                while len(result) < 2:
                    for rank in (0, 1):
                        states.add((rank, c.peers.state(rank).name))
                    await anyio.sleep(0.1)
            assert result == {0: 1, 1: 1}
            assert c.counters["engine_lost"] == 0 and c.metrics()["replies_dropped"]["late"] == 0
            assert {(0, "BUSY"), (1, "BUSY")} <= states
            assert not any(s == "LOST" for _, s in states)
            for rank in (0, 1):
                fractions = [p.fraction for p in seen[rank]]
                assert len(fractions) >= 10, fractions  # it moved, while the handler blocked
                assert fractions == sorted(fractions) and fractions[-1] >= 0.9
                assert all(p.method == "slow_update" for p in seen[rank])
            print(f"\nbusy 4 s: {len(seen[0])}/{len(seen[1])} progress reports, never lost")


async def test_a_blocked_step_does_not_fail_a_concurrent_call(ipc_dir: str) -> None:
    address = f"ipc://{ipc_dir}/c.sock"
    with connect_fleet(address, {0: "poll"}):
        async with ControlClient(ZmqRouterClientTransport(address), ranks=1) as c:
            await c.wait_ready(timeout=15)
            await c.call("block_next_step", 3.0, timeout=5)
            t0 = time.monotonic()
            await anyio.sleep(0.3)  # the engine is in its step now
            states = set()
            async with anyio.create_task_group() as tg:
                done: list[Any] = []

                async def call() -> None:
                    done.append(await c.call("echo", "after the step", timeout=10))

                tg.start_soon(call)
                while not done:
                    states.add((c.peers.state(0).name, c.rank_status(0)["method"]))
                    await anyio.sleep(0.1)
            assert done == ["after the step"] and time.monotonic() - t0 >= 2.5  # the step held it
            assert ("BUSY", "(step)") in states  # the heartbeat said: in its own step
            assert c.counters["engine_lost"] == 0


async def test_kill_9_of_a_busy_engine_is_outcome_unknown_fast(ipc_dir: str) -> None:
    address = f"ipc://{ipc_dir}/c.sock"
    with connect_fleet(address, {0: "poll"}) as fleet:
        async with ControlClient(ZmqRouterClientTransport(address), ranks=1) as c:
            await c.wait_ready(timeout=15)
            async with anyio.create_task_group() as tg:
                outcome: list[BaseException] = []

                async def call() -> None:
                    try:
                        await c.call("sleep", 30.0, timeout=60)
                    except EngineDead as exc:
                        outcome.append(exc)

                tg.start_soon(call)
                while c.peers.state(0) is not PeerState.BUSY:
                    await anyio.sleep(0.02)
                t0 = time.monotonic()
                fleet.kill(0)
                while not outcome:
                    await anyio.sleep(0.01)
                detected = time.monotonic() - t0
            assert isinstance(outcome[0], OutcomeUnknown)  # it was running: may have run
            assert not outcome[0].retry_safe
            print(f"\nkill -9 of a busy engine: OutcomeUnknown after {detected:.3f} s")
            assert detected < 3.0
            with pytest.raises(NotDelivered):  # Lost: fails fast, nothing sent
                await c.call("echo", 1, timeout=5)


async def test_sigstop_then_sigcont_every_outcome_is_honest(ipc_dir: str) -> None:
    """Frozen 3 s then thawed: nothing reported NotDelivered ever runs; what
    succeeded ran exactly once; OutcomeUnknown may have run."""
    address = f"ipc://{ipc_dir}/c.sock"
    with connect_fleet(address, {0: "poll"}) as fleet:
        async with ControlClient(ZmqRouterClientTransport(address), ranks=1) as c:
            await c.wait_ready(timeout=15)
            outcomes: dict[str, str] = {}

            async def mark(token: str) -> None:
                try:
                    await c.call("mark", token, timeout=15)
                    outcomes[token] = "ok"
                except EngineDead as exc:
                    outcomes[token] = type(exc).__name__

            pid = fleet.engines[0].pid
            async with anyio.create_task_group() as tg:
                tg.start_soon(mark, "before")
                await anyio.sleep(0.2)
                os.kill(pid, signal.SIGSTOP)
                try:
                    for i in range(30):  # 3 s of calls at the frozen engine
                        tg.start_soon(mark, f"t{i}")
                        await anyio.sleep(0.1)
                finally:
                    os.kill(pid, signal.SIGCONT)
            with anyio.fail_after(10):
                while c.peers.state(0) not in (PeerState.CONNECTED, PeerState.BUSY):
                    await anyio.sleep(0.05)
            ran = await c.call("marks", timeout=10)
        kinds = sorted(set(outcomes.values()))
        print(f"\nSIGSTOP 3 s: outcomes {kinds}, "
              f"{sum(v == 'NotDelivered' for v in outcomes.values())} not delivered, "
              f"{len(ran)} ran")
        assert "NotDelivered" in kinds and "OutcomeUnknown" in kinds
        assert len(ran) == len(set(ran))  # nothing ran twice
        for token, outcome in outcomes.items():
            if outcome == "NotDelivered":
                assert token not in ran, f"{token} was reported not delivered but ran"
            elif outcome == "ok":
                assert token in ran


@pytest.mark.parametrize("orientation", ["clients_bind", "engines_bind"])
async def test_a_stall_of_the_client_loop_fails_no_call(ipc_dir: str, orientation: str) -> None:
    n = 2
    if orientation == "clients_bind":
        address = f"ipc://{ipc_dir}/c.sock"
        fleet = connect_fleet(address, {r: "poll" for r in range(n)})
        transport: Any = ZmqRouterClientTransport(address)
    else:
        addresses = {r: f"ipc://{ipc_dir}/e{r}.sock" for r in range(n)}
        fleet = EngineFleet(n, lambda r: ["--bind", addresses[r], "--methods", METHODS])
        transport = ZmqDealerClientTransport(addresses)
    with fleet:
        async with ControlClient(transport, ranks=n) as c:
            await c.wait_ready(timeout=15)
            failures: list[BaseException] = []
            results: list[Any] = []

            async def call(rank: int, i: int) -> None:
                try:
                    results.append(await c.call("sleep", 0.3, rank=rank, timeout=30))
                except Exception as exc:
                    failures.append(exc)

            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(call, i % n, i)
                await anyio.sleep(0.05)
                time.sleep(2.0)  # the client's own loop blocks (a blocking call, a GC pause)
                for i in range(4):
                    tg.start_soon(call, i % n, i)
            assert failures == [] and len(results) == 8
            assert c.counters["engine_lost"] == 0 and c.counters["client_stalls"] >= 1
            assert all(c.peers.state(r) is not PeerState.LOST for r in range(n))


async def test_idempotent_retry_after_outcome_unknown_runs_the_handler_once(ipc_dir: str
                                                                            ) -> None:
    """update-like handler; the engine is frozen mid-handler until the client
    declares it lost (OutcomeUnknown), then thawed; the retry with the same
    idempotency key gets the first run's result, and the handler ran once."""
    address = f"ipc://{ipc_dir}/c.sock"
    with connect_fleet(address, {0: "poll"}) as fleet:
        async with ControlClient(ZmqRouterClientTransport(address), ranks=1) as c:
            await c.wait_ready(timeout=15)
            pid = fleet.engines[0].pid
            async with anyio.create_task_group() as tg:
                result: list[Any] = []

                async def update() -> None:
                    result.append(await c.call("slow_update", 1.0, timeout=30,
                                               idempotency_key="weights-v7", retry=3))

                tg.start_soon(update)
                while c.peers.state(0) is not PeerState.BUSY:
                    await anyio.sleep(0.02)
                os.kill(pid, signal.SIGSTOP)
                try:
                    with anyio.fail_after(10):
                        while c.counters["engine_lost"] == 0:  # the first try: OutcomeUnknown
                            await anyio.sleep(0.05)
                finally:
                    os.kill(pid, signal.SIGCONT)
            assert result == [1]  # the first (and only) run's result
            assert c.counters["retries"] >= 1
            counts = await c.call("applied_counts", timeout=10)
            assert counts == {"slow_update": 1}, counts
            engine = (await c.call("metrics", timeout=10))["counters"]
            assert engine["idempotent_replays"] + engine["idempotent_in_progress"] >= 1
            # a fresh key runs it again: the cache is per key, not per method
            assert await c.call("slow_update", 0.1, timeout=30, idempotency_key="v8") == 2


async def test_without_a_key_outcome_unknown_is_not_retried(ipc_dir: str) -> None:
    address = f"ipc://{ipc_dir}/c.sock"
    with connect_fleet(address, {0: "poll"}) as fleet:
        async with ControlClient(ZmqRouterClientTransport(address), ranks=1) as c:
            await c.wait_ready(timeout=15)
            async with anyio.create_task_group() as tg:
                outcome: list[BaseException] = []

                async def update() -> None:
                    try:
                        await c.call("slow_update", 30.0, timeout=60, retry=3)
                    except EngineDead as exc:
                        outcome.append(exc)

                tg.start_soon(update)
                while c.peers.state(0) is not PeerState.BUSY:
                    await anyio.sleep(0.02)
                fleet.kill(0)
            assert isinstance(outcome[0], OutcomeUnknown) and c.counters["retries"] == 0



async def test_report_progress_from_inline_threaded_and_async_handlers() -> None:
    """report_progress reaches the running request from every kind of handler
    (the context travels into worker threads), and is False outside one."""
    from ctlwire.kernel.engine.endpoint import EngineEndpoint, report_progress
    from ctlwire.testing import EngineHarness

    endpoints: list[EngineEndpoint] = []

    def setup(ep: EngineEndpoint) -> None:
        endpoints.append(ep)

        def inline() -> tuple[bool, float]:
            ok = report_progress(0.25, "inline")
            return ok, ep.liveness.progress[next(iter(ep.running))][0]

        def threaded() -> tuple[bool, float]:
            ok = report_progress(0.5, "threaded")
            return ok, ep.liveness.progress[next(iter(ep.running))][0]

        async def asynchronous() -> tuple[bool, float]:
            ok = report_progress(2.0, "async")  # clamped to 1.0
            return ok, ep.liveness.progress[next(iter(ep.running))][0]

        ep.register("inline", inline)
        ep.register("threaded", threaded, threaded=True)
        ep.register("asynchronous", asynchronous)

    async with EngineHarness(ranks=1, setup=setup) as h:
        assert await h.client.call("inline") == [True, 0.25]
        assert await h.client.call("threaded") == [True, 0.5]
        assert await h.client.call("asynchronous") == [True, 1.0]
        assert endpoints[0].running == {} and endpoints[0].liveness.progress == {}
    assert report_progress(0.5) is False


async def test_engine_refuses_a_fencing_token_older_than_one_it_accepted() -> None:
    """A replaced controller (older token) cannot act after its successor: Fenced,
    and the handler does not run. Requests without a token are not fenced."""
    from ctlwire.kernel.engine.endpoint import EngineEndpoint
    from ctlwire.kernel.errors import Fenced
    from ctlwire.testing import EngineHarness

    ran: list[int] = []

    def setup(ep: EngineEndpoint) -> None:
        ep.register("apply", lambda v: ran.append(v) or len(ran))

    async with EngineHarness(ranks=1, setup=setup) as h:
        c = h.client
        assert await c.call("apply", 1, fence=10) == 1  # the new controller
        with pytest.raises(Fenced) as info:
            await c.call("apply", 2, fence=5)  # the old one, after it
        assert info.value.code == 409 and ran == [1]
        assert await c.call("apply", 3) == 2  # unfenced requests still run
        assert await c.call("apply", 4, fence=10) == 3  # the same token again: accepted
        engine = await c.engine_metrics(0)
        assert engine["fence_high"] == 10 and engine["counters"]["fenced"] == 1
    # a client-wide token applies to every call; fence=0 opts one call out of it
    async with EngineHarness(ranks=1, setup=setup, client_kwargs={"fence": 3}) as h:
        c = h.client
        assert await c.call("apply", 5) == 4  # sent with the client's token, 3
        assert await c.call("apply", 6, fence=10) == 5
        with pytest.raises(Fenced):
            await c.call("apply", 7)  # the client's 3 is older than 10 now
        assert await c.call("apply", 8, fence=0) == 6


async def test_a_thawed_old_incarnation_never_takes_its_rank_back(ipc_dir: str) -> None:
    """Rank 0 frozen (SIGSTOP), replaced by a new process, then thawed: every call
    after the replacement is answered by the new process, the client stays on
    the new incarnation, and the old one is never re-admitted."""
    address = f"ipc://{ipc_dir}/c.sock"
    with connect_fleet(address, {0: "poll"}) as old_fleet:
        async with ControlClient(ZmqRouterClientTransport(address), ranks=1) as c:
            await c.wait_ready(timeout=15)
            old_pid = await c.call("pid", timeout=5)
            os.kill(old_pid, signal.SIGSTOP)
            try:
                with anyio.fail_after(10):
                    while not c.peers.is_lost(0):
                        await anyio.sleep(0.05)
                with connect_fleet(address, {0: "poll"}) as new_fleet:
                    new_pid = new_fleet.engines[0].pid
                    with anyio.fail_after(15):
                        while c.peers.is_lost(0):
                            await anyio.sleep(0.05)
                    new_incarnation = c.peers.peers[0].incarnation
                    os.kill(old_pid, signal.SIGCONT)
                    answered = []
                    end = time.monotonic() + 3.0
                    while time.monotonic() < end:  # ~7 s flip-flops were reported
                        try:
                            answered.append(await c.call("pid", timeout=5, retry=2))
                        except EngineDead:
                            answered.append(-1)
                        await anyio.sleep(0.05)
                    assert set(answered) == {new_pid}, answered
                    assert c.peers.peers[0].incarnation == new_incarnation
            finally:
                os.kill(old_pid, signal.SIGCONT)
            print(f"\nthawed old incarnation: {len(answered)} calls, all answered by the "
                  f"new process; fenced frames {c.peers.fenced}")
    assert old_fleet.engines[0].proc.returncode is not None
