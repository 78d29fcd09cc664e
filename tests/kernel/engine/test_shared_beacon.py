"""One beacon for the ranks of one process: the client reads one message a beat for
the process, and still judges each rank on its own heartbeat (busy is not dead,
a frozen process loses all its ranks, a thawed one gets them back).

Real engine processes (``ctlwire.benchmarks.multi_rank_engine``) over ipc.
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from ctlwire.benchmarks.fleets import ModuleFleet
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.engine.shared_beacon import start_shared_beacon
from ctlwire.transports.memory import MemoryNetwork
from ctlwire.transports.zmq_client import ZmqRouterClientTransport
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport

pytestmark = [pytest.mark.timeout(120)]


def test_only_consecutive_dealer_ranks_without_beacons_of_their_own_share_one() -> None:
    address = "ipc:///nonexistent/never-opened"

    def endpoint(rank: int, **kw: object) -> EngineEndpoint:
        return EngineEndpoint(ZmqDealerEngineTransport(address, rank), **kw)  # type: ignore[arg-type]

    with pytest.raises(ValueError):
        start_shared_beacon([])
    with pytest.raises(ValueError, match="beacon=False"):
        start_shared_beacon([endpoint(0)])
    with pytest.raises(ValueError, match="consecutive"):
        start_shared_beacon([endpoint(0, beacon=False), endpoint(2, beacon=False)])
    with pytest.raises(ValueError, match="interval"):
        start_shared_beacon([endpoint(0, beacon=False),
                             endpoint(1, beacon=False, heartbeat_interval=0.5)])
    with pytest.raises(ValueError, match="ZmqDealerEngineTransport"):
        start_shared_beacon([EngineEndpoint(MemoryNetwork().engine_transport(0), beacon=False)])


async def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> float:
    """Seconds until ``predicate()`` holds; fails the test after ``timeout`` s."""
    start = anyio.current_time()
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.01)
    return anyio.current_time() - start


@pytest.mark.anyio
async def test_ranks_sharing_a_beacon_are_judged_each_on_its_own_heartbeat(
        anyio_backend: str, tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/control"
    transport = ZmqRouterClientTransport(address)
    async with ControlClient(transport, ranks=3, default_timeout=20.0) as client:
        fleet = ModuleFleet("ctlwire.benchmarks.multi_rank_engine", [0], lambda _: [
            "--first", "0", "--count", "3", "--connect", address], ready_timeout=60)
        with fleet:
            await client.wait_ready(timeout=30)
            assert [await client.call("echo", r, rank=r) for r in range(3)] == [0, 1, 2]
            beats0, messages0 = (client.counters["heartbeats_received"],
                                 transport.counters["received"])
            # ~4 beats/s for each of 3 ranks, in ~4 messages/s (the calls' replies are
            # done): one message a beat for the process, not one per rank
            await wait_for(lambda: client.counters["heartbeats_received"] - beats0 >= 18, 10.0)
            beats = client.counters["heartbeats_received"] - beats0
            messages = transport.counters["received"] - messages0
            assert messages * 2 < beats, (beats, messages)

            # rank 1 blocks its (the process's only) thread: busy, not dead; its
            # neighbours, not polled meanwhile, are in their step: busy too
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(client.call, "sleep", 1.5, rank=1))
                await wait_for(lambda: client.peers.state(1).name == "BUSY", 10)
                status = client.rank_status(1)
                assert "sleep" in str(status), status
                await anyio.sleep(1.2)  # past the misses a silent rank would be lost in
                assert not any(client.peers.is_lost(r) for r in range(3))
            assert client.counters.get("engine_lost", 0) == 0

            pid = fleet.engines[0].pid
            os.kill(pid, signal.SIGSTOP)
            try:
                frozen = await wait_for(lambda: all(client.peers.is_lost(r)
                                                    for r in range(3)), 10)
            finally:
                os.kill(pid, signal.SIGCONT)
            assert frozen < 2.0
            await wait_for(lambda: not any(client.peers.is_lost(r) for r in range(3)), 15)
            assert [await client.call("echo", r, rank=r) for r in range(3)] == [0, 1, 2]
