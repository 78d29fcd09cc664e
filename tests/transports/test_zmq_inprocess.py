"""Every ZeroMQ transport pair with engines serving in the same event loop (both backends)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import zmq

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.engine_endpoint import EngineEndpoint
from ctlwire.kernel.errors import EngineDead
from ctlwire.transports.transport import ClientTransport, EngineTransport
from ctlwire.transports.zmq_client import (
    ZmqDealerClientTransport,
    ZmqPairClientTransport,
    ZmqPushPullClientTransport,
    ZmqRouterClientTransport,
)
from ctlwire.transports.zmq_engine import (
    ZmqDealerEngineTransport,
    ZmqPairEngineTransport,
    ZmqPushPullEngineTransport,
    ZmqRouterEngineTransport,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
Pair = Callable[[Path, int], tuple[ClientTransport, list[EngineTransport]]]


def router_dealer(tmp: Path, n: int) -> tuple[ClientTransport, list[EngineTransport]]:
    client = ZmqRouterClientTransport(f"ipc://{tmp}/c.sock")
    return client, [ZmqDealerEngineTransport(client.address, r) for r in range(n)]


def dealer_router(tmp: Path, n: int) -> tuple[ClientTransport, list[EngineTransport]]:
    addrs = {r: f"ipc://{tmp}/e{r}.sock" for r in range(n)}
    return (ZmqDealerClientTransport(addrs),
            [ZmqRouterEngineTransport(a, r) for r, a in addrs.items()])


def push_pull(tmp: Path, n: int) -> tuple[ClientTransport, list[EngineTransport]]:
    addrs = {r: f"ipc://{tmp}/req{r}.sock" for r in range(n)}
    client = ZmqPushPullClientTransport(addrs, f"ipc://{tmp}/rep.sock")
    return client, [ZmqPushPullEngineTransport(a, client.reply_address, r)
                    for r, a in addrs.items()]


def pair_inproc(tmp: Path, n: int) -> tuple[ClientTransport, list[EngineTransport]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    addrs = {r: f"inproc://{tmp.name}-pair-{r}" for r in range(n)}
    return (ZmqPairClientTransport(addrs, context=ctx),
            [ZmqPairEngineTransport(a, r, context=ctx) for r, a in addrs.items()])


PAIRS = {"router-dealer": router_dealer, "dealer-router": dealer_router,
         "push-pull": push_pull, "pair-inproc": pair_inproc}


@pytest.mark.parametrize("make", list(PAIRS.values()), ids=list(PAIRS))
async def test_call_fan_out_and_concurrency(make: Pair, tmp_path: Path) -> None:
    client_t, engine_ts = make(tmp_path, 3)
    async with ControlClient(client_t, ranks=3, default_timeout=10.0) as c, \
            anyio.create_task_group() as tg:
        for et in engine_ts:
            ep = EngineEndpoint(et)
            ep.register("echo", lambda x=None: x)
            ep.register("rank", lambda ep=ep: ep.rank)
            await tg.start(ep.serve)
        await c.wait_ready(timeout=10)
        assert await c.call("rank", rank=2) == 2
        assert (await c.fan_out("echo", [1, "a"])).results == {r: [1, "a"] for r in range(3)}
        results: list[Any] = []

        async def caller(i: int) -> None:
            results.append(await c.call("echo", i, rank=i % 3))

        async with anyio.create_task_group() as callers:
            for i in range(600):
                callers.start_soon(caller, i)
        assert sorted(results) == list(range(600))
        assert c.registry.live_count == 0
        tg.cancel_scope.cancel()
    assert not list(tmp_path.glob("*.sock")), "ipc files left behind"


async def test_tcp_ephemeral_port_and_engine_close_is_seen(tmp_path: Path) -> None:
    client_t = ZmqRouterClientTransport("tcp://127.0.0.1:0", allow_insecure_tcp=True)
    async with ControlClient(client_t, ranks=2, default_timeout=10.0) as c:
        assert client_t.address.startswith("tcp://127.0.0.1:")
        engines = [ZmqDealerEngineTransport(client_t.address, r, allow_insecure_tcp=True)
                   for r in range(2)]
        scopes: list[anyio.CancelScope] = []
        async with anyio.create_task_group() as tg:
            for et in engines:
                ep = EngineEndpoint(et)
                ep.register("echo", lambda x=None: x)
                scope = anyio.CancelScope()
                scopes.append(scope)

                async def run(ep: EngineEndpoint = ep, scope: anyio.CancelScope = scope, *,
                              task_status: anyio.abc.TaskStatus[None]) -> None:
                    with scope:
                        await ep.serve(task_status=task_status)

                await tg.start(run)
            await c.wait_ready(timeout=10)
            scopes[1].cancel()  # engine 1 closes its socket
            with anyio.fail_after(5):
                while c.peers.state(1).name != "LOST":
                    await anyio.sleep(0.02)
            with pytest.raises(EngineDead):
                await c.call("echo", 1, rank=1)
            assert await c.call("echo", 0, rank=0) == 0
            tg.cancel_scope.cancel()


def test_foreign_thread_use_is_refused(tmp_path: Path) -> None:
    import threading

    from ctlwire.transports.errors import ForeignThreadError

    et = ZmqDealerEngineTransport(f"ipc://{tmp_path}/x.sock", 0)
    et.open()
    errors: list[BaseException] = []

    def other() -> None:
        try:
            et.try_receive()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    et.close()
    assert len(errors) == 1 and isinstance(errors[0], ForeignThreadError)



async def test_router_client_receives_a_queued_flood_in_order_and_lets_others_run(
        tmp_path: Path) -> None:
    """Events already queued are received in order without waiting, and the receiver
    still yields to the loop now and then (every 64): a flood of replies cannot keep
    the tasks they woke from running."""
    from ctlwire.transports.envelope import Heartbeat

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    client = ZmqRouterClientTransport(f"inproc://{tmp_path.name}-flood", context=ctx)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.ROUTING_ID, b"rank-0")
    dealer.setsockopt(zmq.LINGER, 0)
    flood = 300
    try:
        async with client:
            dealer.connect(client.address)
            for i in range(flood):  # inproc: queued at the client when sent
                dealer.send(client.codec.encode(Heartbeat(0, i, 0)))
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await anyio.sleep(0)

            async with anyio.create_task_group() as tg:
                tg.start_soon(ticker)
                await anyio.sleep(0)  # the ticker has started
                before = ticks
                seen = [(await client.receive()) for _ in range(flood)]
                during = ticks - before
                tg.cancel_scope.cancel()
        assert [getattr(e, "envelope", None) for e in seen] == [
            Heartbeat(0, i, 0) for i in range(flood)]
        assert during >= flood // 64 - 1, during
    finally:
        dealer.close(0)
        ctx.term()


async def test_receive_many_takes_what_is_queued_in_order_up_to_the_limit(
        tmp_path: Path) -> None:
    """``receive_many`` waits for one event, then takes those already queued behind
    it, in order, never more than ``limit``; a later call gets the rest."""
    from ctlwire.transports.envelope import Heartbeat

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    client = ZmqRouterClientTransport(f"inproc://{tmp_path.name}-many", context=ctx)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.ROUTING_ID, b"rank-0")
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        async with client:
            dealer.connect(client.address)

            async def send_later() -> None:
                await anyio.wait_all_tasks_blocked()  # the receiver waits for the first
                for i in range(5):  # inproc: queued at the client when sent
                    dealer.send(client.codec.encode(Heartbeat(0, i, 0)))

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(send_later)
                    first = await client.receive_many(3)
                rest = await client.receive_many(3)
        got = [getattr(e, "envelope", None) for e in first + rest]
        assert [len(first), len(rest)] == [3, 2]
        assert got == [Heartbeat(0, i, 0) for i in range(5)]
    finally:
        dealer.close(0)
        ctx.term()


@pytest.mark.parametrize("kind", ["pair-inproc", "memory"])
async def test_receive_many_of_stream_fed_clients(tmp_path: Path, kind: str) -> None:
    """The clients fed through a memory stream (per-rank readers, the in-memory
    network) take what is queued behind the first event, in order, up to ``limit``."""
    from ctlwire.transports.envelope import Heartbeat
    from ctlwire.transports.memory import MemoryNetwork

    if kind == "memory":
        net = MemoryNetwork()
        client: Any = net.client_transport()
        engine: Any = net.engine_transport(0)
    else:
        client, engines = pair_inproc(tmp_path, 1)
        engine = engines[0]
    async with client, engine:
        for i in range(5):
            engine.send_nowait(None, Heartbeat(0, i, 0))
        with anyio.fail_after(10):
            stream = getattr(client, "_events_out", None) or client._in_recv
            while stream.statistics().current_buffer_used < 5:  # the readers have run
                await anyio.sleep(0.01)
            first = await client.receive_many(3)
            rest = await client.receive_many(3)
    assert [len(first), len(rest)] == [3, 2]
    assert [e.envelope for e in first + rest] == [Heartbeat(0, i, 0) for i in range(5)]
