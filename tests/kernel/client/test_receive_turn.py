"""A caller waiting alone receives its own reply, over real sockets, and receiving
for itself never costs anyone else a frame: replies for other callers, heartbeats
and late replies are handed on as the receive loop hands them on; a deadline or a
cancellation ends the caller's receive and the loop takes over."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from anyio.abc import TaskGroup

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.core.request_registry import PendingRequest
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.errors import ClientClosed, RequestTimedOut
from ctlwire.states import TurnState
from ctlwire.testing import EngineHarness
from ctlwire.transports.zmq_client import ZmqRouterClientTransport
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@asynccontextmanager
async def engine_and_client(tmp_path: Path, release: anyio.Event,
                            heartbeat_interval: float | None = 0.25
                            ) -> AsyncIterator[ControlClient]:
    """A client and one in-process engine over ipc; ``slow`` answers once
    ``release`` is set, ``echo`` at once."""
    transport = ZmqRouterClientTransport(f"ipc://{tmp_path}/c.sock")
    async with ControlClient(transport, ranks=1, default_timeout=10.0,
                             heartbeat_interval=heartbeat_interval) as client, \
            anyio.create_task_group() as tg:
        ep = EngineEndpoint(ZmqDealerEngineTransport(transport.address, 0),
                            heartbeat_interval=heartbeat_interval)

        async def slow() -> str:
            await release.wait()
            return "slow"

        def echo(x: int) -> int:
            return x

        ep.register("slow", slow)
        ep.register("echo", echo)
        await tg.start(ep.serve)
        await client.wait_ready(timeout=10)
        yield client
        tg.cancel_scope.cancel()


async def call_receiving(client: ControlClient, method: str, timeout: float = 10.0) -> str:
    """Call ``method`` as a caller that receives for itself: after a call that
    did, the caller's next call takes the turn before the loop runs again."""
    while True:
        turns = client.receiver.turns
        await client.call("echo", 0)
        if client.receiver.turns > turns:
            result: str = await client.call(method, timeout=timeout)
            return result


async def receiving(client: ControlClient, method: str) -> PendingRequest:
    """The request of ``method`` once its caller receives."""
    with anyio.fail_after(5):
        while (holder := client.receiver.holder) is None or holder.method != method:
            await anyio.sleep(0.001)
    return holder


async def start_slow_call_receiving(client: ControlClient, tg: TaskGroup,
                                    results: list[str]) -> PendingRequest:
    """Start a ``slow`` call (its result into ``results``) in ``tg``; return its
    request once its caller receives."""
    async def slow_call() -> None:
        results.append(await call_receiving(client, "slow"))

    tg.start_soon(slow_call)
    return await receiving(client, "slow")


async def answered(results: list[str]) -> None:
    with anyio.fail_after(5):
        while not results:
            await anyio.sleep(0.001)


async def test_a_lone_sequential_caller_receives_its_own_replies(tmp_path: Path) -> None:
    async with engine_and_client(tmp_path, anyio.Event()) as client:
        before = client.receiver.turns
        for i in range(50):
            assert await client.call("echo", i) == i
        # each call that finds no one receiving receives for itself; on trio the
        # scheduler may let the loop wait first now and then (then it answers)
        assert client.receiver.turns - before >= 25
        assert client.receiver.holder is None
        assert client.registry.live_count == 0


async def test_a_receiving_caller_hands_other_callers_their_replies(tmp_path: Path) -> None:
    release = anyio.Event()
    async with engine_and_client(tmp_path, release) as client, \
            anyio.create_task_group() as tg:
        results: list[str] = []
        holder = await start_slow_call_receiving(client, tg, results)
        turns = client.receiver.turns
        for i in range(5):  # each waits on its waiter; the holder hands it its reply
            assert await client.call("echo", i) == i
        assert client.receiver.holder is holder and client.receiver.turns == turns
        release.set()
        await answered(results)
        assert results == ["slow"] and client.receiver.holder is None


async def test_heartbeats_reach_liveness_while_a_caller_receives(tmp_path: Path) -> None:
    release = anyio.Event()
    # lost after 4 missed heartbeats of 0.05 s: a holder that kept heartbeats from
    # the liveness monitor would have the rank declared lost within the 1 s wait
    async with engine_and_client(tmp_path, release, heartbeat_interval=0.05) as client, \
            anyio.create_task_group() as tg:
        results: list[str] = []
        holder = await start_slow_call_receiving(client, tg, results)
        await anyio.sleep(1.0)
        assert client.receiver.holder is holder
        # only the heartbeats say the rank is busy with the slow handler
        assert client.peers.snapshot() == {0: "BUSY"}
        release.set()
        await answered(results)
        assert results == ["slow"]


@pytest.mark.parametrize("ending", ["deadline", "cancel"])
async def test_a_receiving_caller_that_gives_up_leaves_the_loop_its_late_reply(
        tmp_path: Path, ending: str) -> None:
    release = anyio.Event()
    # no heartbeats: nothing but the caller's own decision may end its receive
    async with engine_and_client(tmp_path, release, heartbeat_interval=None) as client:
        if ending == "deadline":
            with pytest.raises(RequestTimedOut), anyio.fail_after(5):
                await call_receiving(client, "slow", timeout=0.3)
        else:
            with anyio.move_on_after(0.3) as scope:
                await call_receiving(client, "slow")
            assert scope.cancelled_caught
        assert client.receiver.holder is None and client.registry.live_count == 0
        release.set()  # the engine answers now: the loop counts the late reply
        with anyio.fail_after(5):
            while client.registry.stats.late == 0:
                await anyio.sleep(0.01)
        assert await client.call("echo", 7) == 7


async def test_the_turn_follows_its_machine_and_ends_closed_with_the_transport() -> None:
    """The receiver's turn is the ReceiveTurn machine's state: a caller receiving is
    CALLER (the loop parked); the transport closing under it ends the turn for good
    (CLOSED), and the loop then closes the client: the caller gets ClientClosed."""
    release = anyio.Event()

    def setup(ep: EngineEndpoint) -> None:
        async def slow() -> str:
            await release.wait()
            return "slow"

        ep.register("slow", slow)
        ep.register("echo", lambda x: x)

    async with EngineHarness(ranks=1, setup=setup) as h:
        client = h.client
        assert client.receiver.turn in (TurnState.IDLE, TurnState.LOOP)
        outcome: list[BaseException] = []

        async def slow_call() -> None:
            try:
                await call_receiving(client, "slow")
            except ClientClosed as exc:
                outcome.append(exc)

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(slow_call)
                await receiving(client, "slow")
                assert client.receiver.turn is TurnState.CALLER
                h.network._client._close_streams()  # type: ignore[union-attr]
        assert client.receiver.turn is TurnState.CLOSED and client.receiver.holder is None
        assert len(outcome) == 1 and client.closed
        assert client.registry.live_count == 0
