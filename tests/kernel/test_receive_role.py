"""``ReceiveRole``: on trio a caller waiting for its reply receives it itself, and the
receive loop's duties (other callers' replies, heartbeats, losses, close) go on
whoever holds the role. On asyncio there is no role (the reader callback
hands replies over)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import sniffio

from ctlwire.kernel.app.engine_fleet import EngineFleet
from ctlwire.kernel.control_client import ControlClient
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.errors import ClientClosed, EngineDead, RequestTimedOut
from ctlwire.states import PeerState
from ctlwire.transports.zmq_client import ZmqRouterClientTransport
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
METHODS = "ctlwire.kernel.app.engine_process:stepping_methods"


def _current_task() -> Any:
    if sniffio.current_async_library() == "trio":
        import trio

        return trio.lowlevel.current_task()
    import asyncio

    return asyncio.current_task()


@asynccontextmanager
async def _client_and_engines(tmp_path: Path, ranks: int, *, heartbeat: float | None = 0.25,
                              timeout: float = 10.0
                              ) -> AsyncIterator[tuple[ControlClient, anyio.Event]]:
    """A client and ``ranks`` in-process engines (``echo``; ``hang`` until the event
    is set), heartbeating every ``heartbeat`` s both ways (None: not at all), ready
    unless nothing heartbeats. The engines are stopped and ``hang`` released after."""
    transport = ZmqRouterClientTransport(f"ipc://{tmp_path}/c.sock")
    release = anyio.Event()
    async with ControlClient(transport, ranks=ranks, default_timeout=timeout,
                             heartbeat_interval=heartbeat) as client, \
            anyio.create_task_group() as tg:
        for rank in range(ranks):
            ep = EngineEndpoint(ZmqDealerEngineTransport(transport.address, rank),
                                heartbeat_interval=heartbeat)
            ep.register("echo", lambda x=None: x)

            async def hang() -> str:
                await release.wait()
                return "released"

            ep.register("hang", hang)
            await tg.start(ep.serve)
        if heartbeat is not None:
            await client.wait_ready(timeout=10)
        yield client, release
        release.set()
        tg.cancel_scope.cancel()


def _has_role(client: ControlClient) -> bool:
    role = client.issuer.receive_role
    assert (role is not None) == (sniffio.current_async_library() == "trio")
    return role is not None


async def test_a_sequential_caller_receives_its_own_reply(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where each reply was handled: on trio in the caller's own task (the receive
    loop hands the role over once, then the caller keeps it between its calls)."""
    handled_in: list[Any] = []
    original = ControlClient._handle_reply

    def recording(self: ControlClient, event: Any) -> bool:
        handled_in.append(_current_task())
        return original(self, event)

    monkeypatch.setattr(ControlClient, "_handle_reply", recording)
    async with _client_and_engines(tmp_path, 1) as (client, _):
        me = _current_task()
        for i in range(40):
            assert await client.call("echo", i) == i
        if _has_role(client):
            assert sum(t is me for t in handled_in) >= 35, handled_in
            assert client.issuer.receive_role.handed >= 35  # type: ignore[union-attr]
        else:
            assert not any(t is me for t in handled_in)


async def test_the_holder_handles_others_replies_and_heartbeats(tmp_path: Path) -> None:
    """A caller holds the role for a call that hangs: the replies of 20 other calls
    (to another rank, and fan-outs) and the engines' heartbeats are handled all along."""
    async with _client_and_engines(tmp_path, 2, heartbeat=0.05) as (client, release), \
            anyio.create_task_group() as tg:
        for i in range(3):  # the caller takes the role between calls
            assert await client.call("echo", i, rank=0) == i
        result: list[Any] = []

        async def hanging() -> None:
            result.append(await client.call("hang", rank=0))

        tg.start_soon(hanging)
        await anyio.sleep(0.05)
        role = client.issuer.receive_role
        if role is not None:
            assert role.holder is not None  # the hanging caller receives
        beats = client.counters["heartbeats_received"]
        for i in range(20):
            assert await client.call("echo", i, rank=1) == i
            res = await client.fan_out("echo", i, ranks=[1], mode="concurrent")
            assert res.results == {1: i}
        await anyio.sleep(0.3)
        assert client.counters["heartbeats_received"] >= beats + 4
        assert client.rank_status(0)["state"] in ("CONNECTED", "BUSY")
        release.set()
        with anyio.fail_after(5):
            while not result:
                await anyio.sleep(0.01)
        assert result == ["released"]


async def test_expiry_and_cancellation_of_the_holder_give_the_role_back(
        tmp_path: Path) -> None:
    """The holder's request expires (the reaper decides it while it receives), then
    another holder is cancelled: each time the role goes back to the receive loop,
    which goes on handling heartbeats with no call in flight, and calls work."""
    async with _client_and_engines(tmp_path, 1, heartbeat=0.05) as (client, _):
        assert await client.call("echo", 1) == 1
        role = client.issuer.receive_role
        t0 = anyio.current_time()
        with pytest.raises(RequestTimedOut):
            await client.call("hang", timeout=0.3)
        assert anyio.current_time() - t0 < 2.0
        if role is not None:
            assert role.holder is None
        beats = client.counters["heartbeats_received"]
        await anyio.sleep(0.4)
        assert client.counters["heartbeats_received"] >= beats + 3
        assert await client.call("echo", 2) == 2
        with anyio.move_on_after(0.2) as scope:
            await client.call("hang")
        assert scope.cancelled_caught
        if role is not None:
            assert role.holder is None and not role.candidates
        beats = client.counters["heartbeats_received"]
        await anyio.sleep(0.4)
        assert client.counters["heartbeats_received"] >= beats + 3
        assert await client.call("echo", 3) == 3


async def test_a_cancelled_candidate_leaves_nothing_parked(tmp_path: Path) -> None:
    """A caller waiting while another holds the role (a candidate) is cancelled: it
    leaves the candidates, parked nowhere (a later ``set()`` of its waiter wakes no
    task: trio would raise for a task that is not parked), and the holder's call
    still ends with its reply."""
    async with _client_and_engines(tmp_path, 1) as (client, release):
        role = client.issuer.receive_role
        got: list[Any] = []
        async with anyio.create_task_group() as tg:
            async def holder() -> None:
                got.append(await client.call("hang"))

            tg.start_soon(holder)
            if role is not None:
                with anyio.fail_after(5):
                    while role.holder is None:
                        await anyio.sleep(0.005)
            waiters: list[Any] = []
            with anyio.move_on_after(0.3) as scope:
                async def watch() -> None:
                    while role is not None and not role.candidates:
                        await anyio.sleep(0.005)
                    waiters.extend(role.candidates if role is not None else ())

                tg.start_soon(watch)
                await client.call("hang")
            assert scope.cancelled_caught
            if role is not None:
                assert len(waiters) == 1 and not role.candidates
                waiter = waiters[0]
                assert waiter._task is None
                waiter.set()  # harmless: nothing parked
                await anyio.sleep(0.01)
            release.set()
        assert got == ["released"]
        assert await client.call("echo", 5) == 5
        assert client.registry.live_count == 0


async def test_concurrent_callers_leave_the_role_to_the_receive_loop(tmp_path: Path) -> None:
    """32 tasks calling 3 ranks at once: every answer right, one receiver at a time
    (a second would raise BusyResourceError). While several wait, the receive loop
    keeps the role (it takes their replies in batches); a caller alone again gets it."""
    async with _client_and_engines(tmp_path, 3, timeout=20.0) as (client, _):
        wrong: list[Any] = []
        role = client.issuer.receive_role

        async def caller(k: int) -> None:
            for i in range(40):
                value = {"k": k, "i": i}
                got = await client.call("echo", value, rank=(k + i) % 3)
                if got != value:
                    wrong.append((value, got))

        handed = role.handed if role is not None else 0
        async with anyio.create_task_group() as callers:
            for k in range(32):
                callers.start_soon(caller, k)
        assert wrong == []
        assert client.registry.live_count == 0
        if role is not None:
            assert role.holder is None and not role.candidates and role._waiting == 0
            assert role.handed - handed <= 8, role.handed - handed  # at the edges only
            handed = role.handed
            for i in range(20):
                assert await client.call("echo", i) == i
            assert role.handed - handed >= 18


async def test_kill_9_and_close_end_the_holders_wait(tmp_path: Path) -> None:
    """The holder waits for a rank whose engine process is killed (-9): EngineDead at
    once, not the timeout. Then a holder waits when the client closes: ClientClosed."""
    address = f"ipc://{tmp_path}/c.sock"
    fleet = EngineFleet([0, 1], lambda r: ["--connect", address, "--mode", "poll",
                                           "--methods", METHODS])
    with fleet:
        async with ControlClient(ZmqRouterClientTransport(address), ranks=2,
                                 default_timeout=30.0) as client, \
                anyio.create_task_group() as tg:
            await client.wait_ready(timeout=15)
            assert await client.call("echo", 1, rank=1) == 1
            role = client.issuer.receive_role
            outcome: list[BaseException] = []

            async def sleeping(rank: int) -> None:
                try:
                    await client.call("sleep", 20.0, rank=rank)
                except (EngineDead, ClientClosed) as exc:
                    outcome.append(exc)

            tg.start_soon(sleeping, 1)
            with anyio.fail_after(10):
                while client.peers.state(1) is not PeerState.BUSY:
                    await anyio.sleep(0.02)
            if role is not None:
                assert role.holder is not None  # the sleeping caller receives
            t0 = anyio.current_time()
            fleet.kill(1)
            with anyio.fail_after(10):
                while not outcome:
                    await anyio.sleep(0.01)
            assert isinstance(outcome[0], EngineDead)
            assert anyio.current_time() - t0 < 5.0
            assert await client.call("echo", 2, rank=0) == 2
            tg.start_soon(sleeping, 0)
            with anyio.fail_after(10):
                while client.peers.state(0) is not PeerState.BUSY:
                    await anyio.sleep(0.02)
            if role is not None:
                assert role.holder is not None
            await client.aclose()
            with anyio.fail_after(5):
                while len(outcome) < 2:
                    await anyio.sleep(0.01)
            assert isinstance(outcome[1], ClientClosed)


async def test_expiry_ends_the_holders_receive_on_a_silent_socket(tmp_path: Path) -> None:
    """No heartbeats either way and an engine that never answers: nothing arrives on
    the socket, so only the deadline can end the holder's receive, on time."""
    async with _client_and_engines(tmp_path, 1, heartbeat=None) as (client, _):
        with anyio.fail_after(10):
            while True:  # first contact: the engine's hello, then calls go through
                try:
                    assert await client.call("echo", 0, timeout=0.5) == 0
                    break
                except RequestTimedOut:
                    pass
        for i in range(3):
            assert await client.call("echo", i) == i
        for _ in range(3):
            t0 = anyio.current_time()
            with anyio.fail_after(5), pytest.raises(RequestTimedOut):
                await client.call("hang", timeout=0.3)
            assert anyio.current_time() - t0 < 1.5
            assert await client.call("echo", 7) == 7


def _count_loop_steps(steps: list[int]) -> Any:
    """On trio, a ``trio.abc.Instrument`` that counts the steps of the client's
    receive loop task in ``steps[0]`` (None on asyncio)."""
    if sniffio.current_async_library() != "trio":
        return None
    import trio

    class LoopSteps(trio.abc.Instrument):
        def before_task_step(self, task: Any) -> None:
            if task.name == "ctlwire.client.receive":
                steps[0] += 1

    instrument = LoopSteps()
    trio.lowlevel.add_instrument(instrument)
    return instrument


async def test_sequential_calls_do_not_wake_the_receive_loop_each(tmp_path: Path) -> None:
    """A caller alone gives the role back quietly after each call (nothing else
    awaits a reply) and takes it again with its next one: 60 sequential calls wake
    the receive loop a few times (its deadline), not once per call."""
    async with _client_and_engines(tmp_path, 1, heartbeat=None) as (client, _):
        with anyio.fail_after(10):
            while True:  # first contact
                try:
                    assert await client.call("echo", 0, timeout=0.5) == 0
                    break
                except RequestTimedOut:
                    pass
        role = client.issuer.receive_role
        steps = [0]
        instrument = _count_loop_steps(steps)
        quietly = role.given_back_quietly if role is not None else 0
        t0 = anyio.current_time()
        try:
            for i in range(60):
                assert await client.call("echo", i) == i
        finally:
            if instrument is not None:
                import trio

                trio.lowlevel.remove_instrument(instrument)
        elapsed = anyio.current_time() - t0
        if _has_role(client):
            assert role is not None
            assert role.given_back_quietly - quietly >= 55
            # one wake per GIVE_BACK_DELAY at most (each: a step and a park), plus slack
            bound = 2 * (elapsed / role.GIVE_BACK_DELAY + 1) + 10
            assert steps[0] <= min(bound, 40), (steps[0], elapsed)
        assert client.registry.live_count == 0


async def test_after_a_quiet_give_back_the_loop_receives_by_the_delay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a sequential call the caller goes idle: the receive loop, left parked,
    receives again once the give-back delay (here 0.5 s) has passed, so heartbeats
    are handled then, not never; before it, nothing receives."""
    monkeypatch.setattr("ctlwire.kernel.receive_role.ReceiveRole.GIVE_BACK_DELAY", 0.5)
    async with _client_and_engines(tmp_path, 1, heartbeat=0.05) as (client, _):
        for i in range(3):
            assert await client.call("echo", i) == i
        role = client.issuer.receive_role
        quietly = role.given_back_quietly if role is not None else 0
        assert await client.call("echo", 9) == 9
        beats = client.counters["heartbeats_received"]
        await anyio.sleep(0.15)
        if _has_role(client):
            assert role is not None
            assert role.given_back_quietly == quietly + 1 and role.holder is None
            assert client.counters["heartbeats_received"] == beats  # nobody receives yet
        await anyio.sleep(0.75)
        assert client.counters["heartbeats_received"] >= beats + 5
        assert await client.call("echo", 10) == 10


async def test_a_give_back_while_another_request_is_open_wakes_the_loop(
        tmp_path: Path) -> None:
    """A fan-out waits (for a hanging rank) while a caller makes sequential calls to
    another rank: each give-back wakes the receive loop at once (the fan-out's reply
    must not wait for a deadline), none is quiet; released, the fan-out completes."""
    async with _client_and_engines(tmp_path, 2, heartbeat=0.05) as (client, release), \
            anyio.create_task_group() as tg:
        assert await client.call("echo", 0, rank=0) == 0
        role = client.issuer.receive_role
        results: list[Any] = []

        async def fan_out() -> None:
            results.append(await client.fan_out("hang", ranks=[1], mode="concurrent"))

        tg.start_soon(fan_out)
        with anyio.fail_after(5):
            while client.registry.live_count == 0:
                await anyio.sleep(0.005)
        quietly = role.given_back_quietly if role is not None else 0
        handed = role.handed if role is not None else 0
        for i in range(20):
            assert await client.call("echo", i, rank=0) == i
        if _has_role(client):
            assert role is not None
            assert role.handed - handed >= 18  # the caller did receive for itself
            assert role.given_back_quietly == quietly
        release.set()
        with anyio.fail_after(5):
            while not results:
                await anyio.sleep(0.005)
        assert results[0].results == {1: "released"}
        assert client.registry.live_count == 0
