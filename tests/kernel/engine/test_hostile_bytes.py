"""Every byte a peer sends is charged to it (real engine processes that bind, serve
mode): a request waiting to start is charged the whole frame it came in, whatever
field the bytes hide in, and each connection has a byte share of its own."""

from __future__ import annotations

import os
import struct
import threading
import time
from typing import Any

import anyio
import msgspec
import pytest
import zmq
from raw_peer import CODEC, NIL, RawPeer, attacker, engine, error_type, ipc
from test_hostile_routes import _rss_mb

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.transports.envelope import Request
from ctlwire.transports.zmq_client import ZmqDealerClientTransport

pytestmark = pytest.mark.timeout(180)

ANSWER = 10.0
MIB = 1 << 20


def padded(rid: int, method: str, junk: int) -> bytes:
    """A valid request for ``method`` followed by a ``junk``-byte string as one more
    array element: a field this protocol version does not know, which a receiver
    ignores, but whose bytes arrive, and stay alive with the frame."""
    frame = CODEC.encode(Request(rid, 0, method, NIL))
    count = frame[0] & 0x0F
    assert frame[0] & 0xF0 == 0x90 and count < 15
    return bytes([0x90 | (count + 1)]) + frame[1:] + b"\xdb" + struct.pack(">I", junk) + (
        b"j" * junk)


def test_a_waiting_request_is_charged_every_byte_of_its_frame(
        tmp_path: Any, raw_peer: list[RawPeer]) -> None:
    """A peer keeps ``hang`` (async, never returns) running, then sends 40 more
    ``hang`` requests, each with 4 MiB in a trailing field. They are charged 4 MiB
    each: the connection's share (a quarter of the 64 MiB budget) takes three or
    four and the rest are refused ``Busy``; the engine's RSS grows by about what
    the budget admits, not 160 MiB; another connection still queues its own."""
    address = ipc(tmp_path)
    with engine(address, "serve") as fleet:
        pid = fleet.pids()[0]
        bad = attacker(raw_peer, address)
        bad.send("hang")  # the method's one worker is taken: the rest wait
        before = _rss_mb(pid)
        ids = []
        for _ in range(40):
            rid = bad.next_id
            bad.next_id += 1
            bad.sock.send(padded(rid, "hang", 4 * MIB))
            ids.append(rid)
        metrics = bad.metrics(timeout=ANSWER)
        queued = metrics["queued_requests"]
        refused = bad.replies(set(ids[queued["requests"]:]), timeout=ANSWER)
        grown = _rss_mb(pid) - before
        other = attacker(raw_peer, address)
        other_id = other.send("hang")
        other_queued = other.metrics(timeout=ANSWER)["queued_requests"]
        other_refused = other.unclaimed.get(other_id)
    print(f"\nqueued {queued}; RSS grew {grown:.1f} MB")
    assert 3 <= queued["requests"] <= 4
    assert queued["bytes"] >= queued["requests"] * 4 * MIB
    assert queued["bytes"] <= queued["limit_bytes_per_route"] + 4 * MIB + 4096
    assert {error_type(r) for r in refused.values()} == {"Busy"}
    assert len(refused) == 40 - queued["requests"]
    assert grown < 64, grown  # 40 x 4 MiB = 160 MiB if every frame were kept
    assert other_refused is None
    assert other_queued["requests"] == queued["requests"] + 1


def _trace_bomb(rid: int, entries: int) -> bytes:
    """A request whose ``trace`` has ``entries`` short keys (about 8 bytes each):
    unbounded, decoding it would hold the GIL for about a second per million."""
    trace = {f"{n:06x}": "" for n in range(entries)}
    return msgspec.msgpack.encode(["q", rid, 0, "echo", None, 0.0, 0, 0, trace])


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["poll", "serve"])
async def test_frames_full_of_trace_entries_are_refused_unread_and_the_rank_stays_live(
        mode: str, tmp_path: Any, raw_peer: list[RawPeer], anyio_backend: str) -> None:
    """A peer sends 20 frames of about 15 MB, each a request whose ``trace`` holds
    1.8 million entries, while a controller calls the engine ten times a second:
    each frame is answered ``MalformedFrame`` (refused from the map's header), every
    call succeeds and the controller never judges the rank lost."""
    address = ipc(tmp_path)
    bomb = _trace_bomb(1, 1_800_000)
    with engine(address, mode, ["--backend", anyio_backend]):
        async with ControlClient(ZmqDealerClientTransport([address]), ranks=1) as client:
            await client.wait_ready(timeout=ANSWER)
            bad = attacker(raw_peer, address)
            ids = set(range(1, 21))

            def flood() -> dict[int, Any]:
                for rid in ids:
                    bad.sock.send(bomb[:3] + bytes([rid]) + bomb[4:])  # id: a fixint
                return bad.replies(ids, timeout=120)

            calls = 0
            async with anyio.create_task_group() as tg:
                answers: dict[int, Any] = {}

                async def run_flood() -> None:
                    answers.update(await anyio.to_thread.run_sync(flood))
                    tg.cancel_scope.cancel()

                tg.start_soon(run_flood)
                while True:
                    assert await client.call("echo", calls, rank=0, timeout=ANSWER) == calls
                    calls += 1
                    await anyio.sleep(0.1)
            lost = client.counters["engine_lost"]
    print(f"\n{mode}: {len(answers)} frames answered, {calls} calls, lost {lost}")
    assert {error_type(r) for r in answers.values()} == {"MalformedFrame"}
    assert len(answers) == 20
    assert lost == 0


@pytest.mark.anyio
async def test_what_peers_send_a_beacon_is_read_and_refused_never_kept(
        tmp_path: Any, anyio_backend: str) -> None:
    """For 4 s, four peers send random 4 KB subscriptions to an engine's beacon (an
    XSUB each) and four send it random 4 KB frames (a DEALER each), as fast as it
    takes them: the engine keeps none of it (its RSS grows by a few MB; a PUB keeps
    every subscription, hundreds of MB), counts the frames refused, and a
    controller's own beacon keeps the rank live throughout."""
    address = ipc(tmp_path)
    beacon = address + ".beat"
    with engine(address, "serve", ["--backend", anyio_backend]) as fleet:
        pid = fleet.pids()[0]
        async with ControlClient(ZmqDealerClientTransport([address]), ranks=1) as client:
            await client.wait_ready(timeout=ANSWER)
            before = _rss_mb(pid)
            stop = threading.Event()
            sent = [0] * 8

            def flood(n: int) -> None:
                ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
                sock = ctx.socket(zmq.XSUB if n % 2 else zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(beacon)
                try:
                    while not stop.is_set():
                        try:
                            sock.send(b"\x01" + os.urandom(4000), zmq.NOBLOCK)
                            sent[n] += 1
                        except zmq.Again:
                            time.sleep(0.001)
                finally:
                    sock.close(0)
                    ctx.term()

            threads = [threading.Thread(target=flood, args=(n,)) for n in range(8)]
            for t in threads:
                t.start()
            try:
                for i in range(20):
                    await anyio.sleep(0.2)
                    assert await client.call("echo", i, rank=0, timeout=ANSWER) == i
                grown = _rss_mb(pid) - before
            finally:
                stop.set()
                for t in threads:
                    t.join()
            metrics = await client.call("ctlwire.metrics", rank=0, timeout=ANSWER)
            lost = client.counters["engine_lost"]
    print(f"\nsent {sum(sent)} frames and subscriptions; beacon refused "
          f"{metrics['beacon_refused']}; RSS grew {grown:.1f} MB")
    assert metrics["beacon_refused"]["frames"] > 100
    assert grown < 32, grown
    assert lost == 0


def test_one_connection_at_full_speed_keeps_the_engine_within_its_budgets(
        tmp_path: Any, raw_peer: list[RawPeer]) -> None:
    """One connection sends 4 MiB requests as fast as the engine takes them for 5 s
    (one method's worker held, so each waits or is refused ``Busy``): the engine's RSS
    grows by no more than what its budgets allow together -- libzmq's bound for one
    connection, the waiting requests' byte budget and the reply outbox's."""
    address = ipc(tmp_path)
    with engine(address, "serve") as fleet:
        pid = fleet.pids()[0]
        bad = attacker(raw_peer, address)
        bad.send("hang")
        bound = bad.metrics(timeout=ANSWER)
        before = _rss_mb(pid)
        peak, sent, end = before, 0, time.monotonic() + 5.0
        head = len(padded(1_000_000, "hang", 0)) - 5  # the trailing field: str32 + bytes
        junk = padded(1_000_000, "hang", 4 * MIB)[head:]
        while time.monotonic() < end:
            try:  # a fresh id each time (a repeated one is dropped as a duplicate)
                bad.sock.send(padded(1_000_000 + sent, "hang", 0)[:head] + junk,
                              zmq.NOBLOCK)
                sent += 1
            except zmq.Again:
                time.sleep(0.005)
            if sent % 8 == 0:
                peak = max(peak, _rss_mb(pid))
            while bad.sock.poll(0):
                bad.sock.recv()  # read the Busy replies: nothing waits for us
        peak = max(peak, _rss_mb(pid))
        metrics = bad.metrics(timeout=ANSWER)
    allowed = (bound["outbox"]["transport_bound_bytes_per_connection"]
               + bound["queued_requests"]["limit_bytes"] + (32 << 20)) / MIB
    print(f"\nsent {sent} x 4 MiB; RSS {before:.0f} -> peak {peak:.0f} MB; "
          f"budgets allow {allowed:.0f} MB; busy {metrics['counters']['busy']}")
    assert sent > 10 and metrics["counters"]["busy"] > 0
    assert peak - before <= allowed
