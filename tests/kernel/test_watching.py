"""Watching many ranks: real engine processes hosting many ranks each.

A client watching ranks hosted many to a process (as
``ctlwire.benchmarks.multi_rank_engine`` hosts them) tells a killed rank, a
frozen rank and a busy rank apart; beacons beat in phase, and a live rank hears
the client's heartbeat less often than a rank not live.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest
import zmq

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.benchmarks.fleets import ModuleFleet
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.client.liveness_monitor import LIVE_HEARTBEAT_EVERY
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.envelope import Heartbeat
from ctlwire.transports.zmq_beacon import LivenessBeacon
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

RANKS = 16  # ranks 0..14 in one process, the victim (15) alone in another
VICTIM = RANKS - 1
INTERVAL = 0.25


def _fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, EngineFleet]]:
    d = tmp_path_factory.mktemp("watch")
    os.chmod(d, 0o700)
    address = f"ipc://{d}/client.sock"
    procs = [(0, RANKS - 1), (VICTIM, 1)]
    f = ModuleFleet("ctlwire.benchmarks.multi_rank_engine", len(procs), lambda i: [
        "--first", str(procs[i][0]), "--count", str(procs[i][1]), "--connect", address,
        "--heartbeat", str(INTERVAL)], ready_timeout=60.0)
    f.start()
    try:
        yield address, f
    finally:
        f.stop()


@pytest.fixture
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, EngineFleet]]:
    """A fleet of its own, for a test that kills a process."""
    yield from _fleet(tmp_path_factory)


@pytest.fixture(scope="module")
def shared_fleet(tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[tuple[str, EngineFleet]]:
    """One fleet for the tests that leave every process serving (each its own client)."""
    yield from _fleet(tmp_path_factory)


async def _watch(fleet: tuple[str, EngineFleet]
                 ) -> AsyncIterator[tuple[ControlClient, EngineFleet]]:
    address, f = fleet
    async with ControlClient(ZmqRouterClientTransport(address), ranks=RANKS,
                             heartbeat_interval=INTERVAL, default_timeout=30.0) as ctl:
        await ctl.wait_ready(timeout=30)
        yield ctl, f


@pytest.fixture
async def watching(shared_fleet: tuple[str, EngineFleet]
                   ) -> AsyncIterator[tuple[ControlClient, EngineFleet]]:
    async for watched in _watch(shared_fleet):
        yield watched


@pytest.fixture
async def watching_own(fleet: tuple[str, EngineFleet]
                       ) -> AsyncIterator[tuple[ControlClient, EngineFleet]]:
    async for watched in _watch(fleet):
        yield watched


async def _until(ctl: ControlClient, rank: int, lost: bool, limit: float) -> float:
    start = anyio.current_time()
    with anyio.fail_after(limit):
        while ctl.peers.is_lost(rank) != lost:
            await anyio.sleep(0.01)
    return anyio.current_time() - start


def _others_live(ctl: ControlClient) -> bool:
    return all(not ctl.peers.is_lost(r) for r in range(RANKS) if r != VICTIM)


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_a_killed_rank_among_many_is_lost_and_no_other(
        watching_own: tuple[ControlClient, EngineFleet]) -> None:
    ctl, f = watching_own
    os.kill(f.engines[f.ranks[-1]].pid, signal.SIGKILL)
    await _until(ctl, VICTIM, True, 10.0)
    await anyio.sleep(3 * INTERVAL)
    assert _others_live(ctl)
    assert ctl.counters["engine_lost"] == 1


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_a_frozen_rank_is_lost_by_its_silence_then_rejoins(
        watching: tuple[ControlClient, EngineFleet]) -> None:
    """SIGSTOP leaves the connections open: only the beacon's silence tells."""
    ctl, f = watching
    pid = f.engines[f.ranks[-1]].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        await _until(ctl, VICTIM, True, 10.0)
        assert _others_live(ctl)
    finally:
        os.kill(pid, signal.SIGCONT)
    await _until(ctl, VICTIM, False, 15.0)
    assert (await ctl.call("echo", "back", rank=VICTIM)) == "back"
    assert ctl.counters["engine_lost"] == 1


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_ranks_whose_process_blocks_for_seconds_are_busy_not_dead(
        watching: tuple[ControlClient, EngineFleet]) -> None:
    """A handler blocking its process's only serving thread for 8 intervals:
    every rank of that process stays alive (their beacons keep beating)."""
    ctl, _ = watching
    blocked = 8 * INTERVAL
    assert (await ctl.call("sleep", blocked, rank=0, timeout=30)) == blocked
    assert ctl.counters["engine_lost"] == 0
    assert all(not ctl.peers.is_lost(r) for r in range(RANKS))


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_live_ranks_hear_the_client_once_every_few_intervals(
        watching: tuple[ControlClient, EngineFleet]) -> None:
    ctl, _ = watching
    sent0 = ctl.counters["heartbeats_sent"]
    t0 = anyio.current_time()
    await anyio.sleep(12 * INTERVAL)
    ticks = (anyio.current_time() - t0) / INTERVAL
    sent = ctl.counters["heartbeats_sent"] - sent0
    assert sent > 0
    # every interval to every rank would be ``ticks * RANKS``
    assert sent <= (ticks / LIVE_HEARTBEAT_EVERY + 1) * RANKS


def test_beacons_started_apart_beat_in_phase() -> None:
    """Two beacons started a third of an interval apart send at the same phase."""
    interval = 0.3
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sink = ctx.socket(zmq.PULL)
    sink.bind("inproc://beacons")
    arrivals: dict[int, list[float]] = {0: [], 1: []}
    lock = threading.Lock()

    def make() -> zmq.Socket[bytes]:
        sock = ctx.socket(zmq.PUSH)
        sock.connect("inproc://beacons")
        return sock

    beacons = [LivenessBeacon(make, MsgpackCodec(), interval,
                              lambda r=r: Heartbeat(r, 1, 0)) for r in (0, 1)]
    codec = MsgpackCodec()
    try:
        beacons[0].start()
        time.sleep(interval / 3)
        beacons[1].start()
        deadline = time.monotonic() + 8 * interval
        while time.monotonic() < deadline:
            if sink.poll(50):
                hb = codec.decode(sink.recv())
                assert isinstance(hb, Heartbeat)
                with lock:
                    arrivals[hb.rank].append(time.monotonic())
    finally:
        for b in beacons:
            b.stop()
        sink.close(0)
        ctx.term()
    # skip each one's first heartbeat (sent at once by start())
    phases = {r: [t % interval for t in times[1:]] for r, times in arrivals.items()}
    assert len(phases[0]) >= 4 and len(phases[1]) >= 4

    def apart(a: float, b: float) -> float:
        d = abs(a - b) % interval
        return min(d, interval - d)

    gaps = sorted(apart(a, b) for a in phases[0] for b in phases[1])
    assert gaps[len(gaps) // 2] < interval / 6, gaps
