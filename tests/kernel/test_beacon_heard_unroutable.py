"""A rank whose beacon heartbeats keep arriving is live, even while the client's
own heartbeat to it is unroutable (its request connection is being
re-established): it is neither marked lost nor are its calls failed. Once its
heartbeats stop too, it is lost."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from ctlwire.kernel.client.liveness_monitor import LivenessMonitor
from ctlwire.kernel.engine.liveness import new_incarnation
from ctlwire.states import LIVE_PEER_STATES
from ctlwire.transports.envelope import Heartbeat
from ctlwire.transports.errors import Unroutable
from ctlwire.transports.memory import MemoryClientTransport, MemoryNetwork

pytestmark = pytest.mark.anyio

INTERVAL = 0.1


class Unroutable0(MemoryClientTransport):
    """A client transport whose sends to rank 0 are unroutable."""

    def send_nowait(self, rank: int, envelope: Any) -> None:
        raise Unroutable(rank, "no route to rank 0 (reconnecting)")


async def test_a_rank_heard_through_its_beacon_is_not_lost_when_unroutable() -> None:
    failed: list[tuple[int, str]] = []
    counters: dict[str, int] = {"heartbeats_sent": 0, "heartbeats_received": 0,
                                "engine_lost": 0, "engine_restarted": 0,
                                "engine_stalled": 0, "client_stalls": 0}
    monitor = LivenessMonitor(Unroutable0(MemoryNetwork()), [0], interval=INTERVAL,
                              misses_allowed=3,
                              fail_rank=lambda r, why: failed.append((r, why)),
                              counters=counters)
    incarnation = new_incarnation()
    seq = 0

    def beacon() -> None:
        nonlocal seq
        seq += 1
        monitor.heartbeat(0, Heartbeat(0, incarnation, seq))

    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run, 1)
        with anyio.move_on_after(12 * INTERVAL):
            while True:  # the beacon, several times an interval
                beacon()
                await anyio.sleep(INTERVAL / 5)
        assert monitor.peers.state(0) in LIVE_PEER_STATES
        assert failed == [] and counters["engine_lost"] == 0
        # its heartbeats stop as well: now it is gone
        with anyio.fail_after(30):
            while not counters["engine_lost"]:
                await anyio.sleep(INTERVAL)
        tg.cancel_scope.cancel()
    assert failed and failed[0][0] == 0
