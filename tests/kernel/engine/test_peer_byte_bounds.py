"""Bytes a peer controls are bounded in bytes: the engine's reply outbox (per route
and in total) and libzmq's own pipes, whose high-water marks an engine sizes from
the frame limit. Sizes and counts are asserted, never durations."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import anyio
import pytest
import zmq

from ctlwire.kernel.app.engine_fleet import EngineFleet
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.envelope import Reply, Request
from ctlwire.transports.errors import TransportClosed, WouldBlock
from ctlwire.transports.transport import EngineTransport, Received
from ctlwire.transports.zmq_client import ZmqDealerClientTransport
from ctlwire.transports.zmq_config import ZmqOptions

# -- the outbox: bytes per full route, and in total ---------------------------------------


class _FullRoutes(EngineTransport):
    """An engine transport whose routes named ``full-*`` never take a reply."""

    def __init__(self) -> None:
        self.codec = MsgpackCodec()
        self.rank = 0
        self.inbox: list[Any] = []
        self.sent: list[tuple[Any, int]] = []
        self.next_id = 0

    def try_receive(self) -> Any:
        return self.inbox.pop(0) if self.inbox else None

    async def receive(self) -> Any:
        raise TransportClosed("polled only")

    def send_encoded_nowait(self, route: Any, data: bytes) -> None:
        if route.startswith(b"full-"):
            raise WouldBlock("full")
        self.sent.append((route, self.codec.decode(data).id))

    def heartbeat_routes(self) -> list[Any]:
        return []


def _flood(ep: EngineEndpoint, transport: _FullRoutes, routes: list[bytes], per_route: int,
           payload: str) -> None:
    codec = transport.codec
    for _ in range(per_route):
        for route in routes:
            transport.next_id += 1
            req = Request(transport.next_id, 0, "echo", codec.encode_value(payload), client=1)
            transport.inbox.append(Received(req, route=route))
        while transport.inbox:
            ep.poll()


def test_bytes_queued_for_one_full_route_stay_under_max_unread_bytes() -> None:
    """Replies of ~10 KB to a route that never takes one: the route's queued bytes
    never pass ``max_unread_bytes`` (the reply count bound is far away), and every
    reply that did not fit is counted as dropped."""
    transport = _FullRoutes()
    ep = EngineEndpoint(transport, heartbeat_interval=None,
                        max_unread_replies=10_000, max_unread_bytes=100_000,
                        max_outbox_bytes=10 << 20)
    ep.register("echo", lambda v: v, payload_type=Any)
    sizes = []
    for _ in range(40):
        _flood(ep, transport, [b"full-a"], 1, "x" * 10_000)
        sizes.append(ep.outbox_bytes)
    queued = ep.outbox_replies
    print(f"\nqueued {queued} replies, {ep.outbox_bytes} B (peak {ep.outbox_peak_bytes} B); "
          f"dropped {ep.counters['replies_dropped_unread']}")
    assert max(sizes) <= 100_000 and ep.outbox_peak_bytes <= 100_000
    assert ep.outbox_bytes > 90_000  # filled to its bound, not refused early
    assert queued + ep.counters["replies_dropped_unread"] == 40
    assert ep.counters["replies_dropped_unread"] == 40 - queued > 0


def test_outbox_total_across_several_full_routes_stays_under_max_outbox_bytes() -> None:
    """Eight full routes, each allowed 100 KB: the total never passes the
    outbox's 250 KB, the excess is counted as dropped, and a route that reads is
    still answered."""
    transport = _FullRoutes()
    ep = EngineEndpoint(transport, heartbeat_interval=None,
                        max_unread_replies=10_000, max_unread_bytes=100_000,
                        max_outbox_bytes=250_000)
    ep.register("echo", lambda v: v, payload_type=Any)
    routes = [b"full-%d" % i for i in range(8)]
    peak_seen = 0
    for _ in range(20):
        _flood(ep, transport, [*routes, b"reader"], 1, "y" * 5_000)
        peak_seen = max(peak_seen, ep.outbox_bytes)
    per_route = {r: sum(size for _, size in q) for r, q in ep.outbox.queues.items()}
    print(f"\ntotal {ep.outbox_bytes} B over {len(per_route)} routes, peak "
          f"{ep.outbox_peak_bytes} B, dropped {ep.counters['replies_dropped_unread']}")
    assert peak_seen <= 250_000 and ep.outbox_peak_bytes <= 250_000
    assert ep.outbox_bytes > 240_000
    assert all(v <= 100_000 for v in per_route.values())
    assert ep.outbox_replies + ep.counters["replies_dropped_unread"] == 8 * 20
    assert ep.counters["replies_dropped_unread"] > 0
    assert len([rid for route, rid in transport.sent if route == b"reader"]) == 20


# -- libzmq's pipes: a peer that never reads (real processes) -------------------------------


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


PAYLOAD_BYTES = 128 * 1024


class NonReader:
    """A raw DEALER that sends ``count`` echo requests of 128 KiB and never reads
    a reply; samples the engine's RSS as it goes."""

    def __init__(self, address: str, pid: int, count: int) -> None:
        self.address, self.pid, self.count = address, pid, count
        self.sent = 0
        self.peak = 0.0
        self.stuck = False
        self.done = threading.Event()

    def run(self) -> None:
        codec = MsgpackCodec()
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.RCVHWM, 1)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.address)
        payload = codec.encode_value("x" * PAYLOAD_BYTES)
        last = time.monotonic()
        try:
            while self.sent < self.count:
                try:
                    sock.send(codec.encode(Request(self.sent + 1, 0, "echo", payload, client=66)),
                              zmq.NOBLOCK)
                except zmq.Again:
                    if time.monotonic() - last > 20:  # the engine stopped taking requests
                        self.stuck = True
                        break
                    time.sleep(0.002)
                    continue
                last = time.monotonic()
                self.sent += 1
                if self.sent % 100 == 0:
                    self.peak = max(self.peak, _rss_mb(self.pid))
            time.sleep(0.5)  # let the engine take what is queued
            self.peak = max(self.peak, _rss_mb(self.pid))
        finally:
            self.done.set()
            sock.close(0)
            ctx.term()


@pytest.mark.anyio
@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["poll", "serve"])
async def test_a_client_that_never_reads_cannot_grow_the_engine_past_its_byte_bound(
        mode: str, tmp_path: Any) -> None:
    """4,000 echo requests of 128 KiB (~512 MB of replies) from a DEALER that never
    reads: the engine's RSS grows by less than its documented per-connection
    bound for messages of this size (libzmq: ``SNDHWM + RCVHWM + 2`` messages, the
    high-water marks sized from the frame limit; plus the outbox's per-route
    bound, or under ``serve`` the queued requests' byte budget) and some slack;
    the dropped replies are counted in its metrics, which report the
    per-connection bound. Before, libzmq's send pipe held up to 10,000
    replies (~1.3 GB here) while the outbox reported 0 B."""
    os.chmod(tmp_path, 0o700)
    address = f"ipc://{tmp_path}/e.sock"
    count = 4_000
    with EngineFleet(1, lambda r: ["--bind", address, "--mode", mode]) as fleet:
        pid = fleet.pids()[0]
        async with ControlClient(ZmqDealerClientTransport([address]), ranks=1) as client:
            assert await client.call("echo", "warm", rank=0, timeout=10) == "warm"
            base = _rss_mb(pid)
            flood = NonReader(address, pid, count)
            thread = threading.Thread(target=flood.run, daemon=True)
            thread.start()
            await anyio.to_thread.run_sync(flood.done.wait)
            thread.join()
            assert await client.call("echo", "after", rank=0, timeout=10) == "after"
            metrics = await client.call("metrics", rank=0, timeout=10)
    options, codec = ZmqOptions(), MsgpackCodec()
    limit = codec.max_message_size
    messages = (options.effective_sndhwm(limit, peer_sized=True)
                + options.effective_rcvhwm(limit) + 2)
    frame_mb = (PAYLOAD_BYTES + 1024) / 2**20
    # + the outbox's per-route bound (poll) or the queued requests' budget plus one
    # request (serve), + slack for the interpreter
    queued = metrics["queued_requests"]
    held_mb = 4.0 if mode == "poll" else queued["limit_bytes"] / 2**20 + frame_mb
    bound_mb = messages * frame_mb + held_mb + 40
    grew = flood.peak - base
    print(f"\n{mode}: sent {flood.sent}/{count}, engine RSS {base:.1f} -> peak "
          f"{flood.peak:.1f} MB (+{grew:.1f}, bound {bound_mb:.1f}); dropped "
          f"{metrics['counters']['replies_dropped_unread']}; outbox {metrics['outbox']}")
    assert not flood.stuck and flood.sent == count
    assert grew < bound_mb, (grew, bound_mb)
    assert metrics["counters"]["replies_dropped_unread"] > count // 2
    assert metrics["outbox"]["peak_bytes"] <= 4 << 20
    assert queued["peak_bytes"] <= queued["limit_bytes"] + PAYLOAD_BYTES + 1024
    assert metrics["outbox"]["transport_bound_bytes_per_connection"] == (
        messages * options.hard_limit(limit))


# -- serve: requests waiting to start are bounded in bytes -----------------------------------


@pytest.mark.anyio
async def test_requests_waiting_to_start_stay_under_their_byte_budget(tmp_path: Any) -> None:
    """A peer sends 100 requests of 64 KiB to a method that is held (one at a
    time): the requests the engine has taken and not started never hold more
    than ``max_queued_request_bytes``; those beyond are refused ``Busy`` at once
    (counted, never run) rather than left waiting; once the method runs again
    every request has its one reply, none lost."""
    from ctlwire.transports.zmq_engine import ZmqRouterEngineTransport

    os.chmod(tmp_path, 0o700)
    transport = ZmqRouterEngineTransport(f"ipc://{tmp_path}/e.sock", 0)
    budget = 1 << 20
    ep = EngineEndpoint(transport, max_queued_request_bytes=budget, heartbeat_interval=None,
                        max_queued_per_route=1000)
    gate = anyio.Event()
    ran: list[int] = []

    @ep.method()
    async def held(value: str) -> int:
        ran.append(len(value))
        await gate.wait()
        return len(value)

    codec = MsgpackCodec()
    payload = codec.encode_value("z" * 65536)
    ctx: zmq.Context[Any] = zmq.Context()
    sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    replies: list[Reply] = []

    def read() -> None:
        while sock.poll(0):
            env = codec.decode(sock.recv())
            if isinstance(env, Reply):
                replies.append(env)

    try:
        async with anyio.create_task_group() as tg:
            await tg.start(ep.serve)
            sock.connect(transport.address)
            for i in range(100):
                sock.send(codec.encode(Request(i + 1, 0, "held", payload, client=5)))
            with anyio.fail_after(60):
                # until the engine has taken and decided every request: running,
                # waiting or refused
                while (len(ep.running) + ep.queued_requests.count + ep.counters["busy"]
                       < 100):
                    read()
                    await anyio.sleep(0.01)
            peak = ep.queued_requests.peak
            gate.set()
            with anyio.fail_after(60):
                while len(replies) < 100:
                    read()
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    finally:
        sock.close(0)
        ctx.term()
    busy = [r for r in replies if not r.ok]
    print(f"\nqueued peak {peak} B (budget {budget} B), replies {len(replies)}, "
          f"busy {len(busy)}")
    assert peak <= budget
    assert len(replies) == 100 and len({r.id for r in replies}) == 100
    assert busy and all(r.error is not None and r.error.type == "Busy" for r in busy)
    assert len(busy) == ep.counters["busy"] and len(ran) == 100 - len(busy)
    assert ep.queued_requests.held == 0


def test_only_an_engine_that_binds_sizes_its_send_pipe_from_the_frame_limit(
        tmp_path: Any) -> None:
    """An engine that binds answers whoever connects: its ``SNDHWM`` is bounded in
    bytes. One that dials answers the client it chose: ``SNDHWM`` stays high, so
    bursts of replies do not wait for libzmq's I/O thread."""
    from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport, ZmqRouterEngineTransport

    os.chmod(tmp_path, 0o700)
    options, limit = ZmqOptions(), MsgpackCodec().max_message_size
    bound = ZmqRouterEngineTransport(f"ipc://{tmp_path}/e.sock", 0)
    dialer = ZmqDealerEngineTransport(f"ipc://{tmp_path}/c.sock", 0)
    for t in (bound, dialer):
        t.open()
    try:
        assert bound._send is not None and dialer._send is not None
        sized = bound._send.socket.getsockopt(zmq.SNDHWM)
        kept = dialer._send.socket.getsockopt(zmq.SNDHWM)
    finally:
        for t in (bound, dialer):
            t.close()
    print(f"\nSNDHWM: binds {sized}, dials {kept}")
    assert sized == options.effective_sndhwm(limit, peer_sized=True) == 15
    assert sized * options.hard_limit(limit) <= options.max_queued_bytes
    assert kept == options.sndhwm
