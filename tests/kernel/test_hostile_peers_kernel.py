"""Hostile peers, kernel side: they cannot grow kernel structures without
bound, stall replies to other clients, evict legitimate routes, or impersonate
a rank under CURVE. Counts and sizes are asserted, never durations."""

from __future__ import annotations

from typing import Any

import msgspec

from ctlwire.kernel.core.request_registry import ReplyDisposition, RequestRegistry
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.envelope import Reply, Request
from ctlwire.transports.errors import TransportClosed, WouldBlock
from ctlwire.transports.transport import EngineTransport, Received

NIL = msgspec.Raw(b"\xc0")


def test_a_tombstone_never_grows_past_the_ranks_its_request_addressed() -> None:
    """Replies to a cleaned request claiming 10,000 different ranks are counted
    stray; the tombstone keeps at most the addressed ranks."""
    reg = RequestRegistry(max_tombstones=4)
    entry = reg.register("m", (0, 1))
    assert reg.plan_sends(entry) == [0, 1]
    reg.sent(entry, 0)
    reg.sent(entry, 1)
    assert reg.on_reply(Reply(entry.id, 0, 1, True, NIL))[0] is ReplyDisposition.ACCEPTED
    reg.release(entry)  # cancelled with rank 1 outstanding
    dispositions: dict[ReplyDisposition, int] = {}
    for rank in range(10_000):
        disp, _ = reg.on_reply(Reply(entry.id, rank, 1, True, NIL))
        dispositions[disp] = dispositions.get(disp, 0) + 1
    tomb: Any = reg._tombstones[entry.id]
    print(f"tombstone answered set after 10,000 forged ranks: {sorted(tomb.answered)}")
    assert tomb.answered == {0, 1}
    # rank 0 had answered (duplicate), rank 1 is late once, the other 9,998 are stray
    assert dispositions == {ReplyDisposition.DUPLICATE: 1, ReplyDisposition.LATE: 1,
                            ReplyDisposition.STRAY: 9_998}
    assert reg.stats.stray == 9_998
    reg.check_invariants()


def test_a_reply_whose_connection_rank_differs_from_its_claim_never_enters_a_tombstone() -> None:
    reg = RequestRegistry()
    entry = reg.register("m", (0,))
    reg.plan_sends(entry)
    reg.sent(entry, 0)
    reg.release(entry)
    # the envelope claims rank 0 but came in on rank 5's connection
    assert reg.on_reply(Reply(entry.id, 0, 1, True, NIL), peer=5)[0] is ReplyDisposition.STRAY
    assert reg._tombstones[entry.id].answered == set()


class _FullRouteTransport(EngineTransport):
    """An engine transport whose route ``b"hostile"`` is always full."""

    def __init__(self) -> None:
        self.codec = MsgpackCodec()
        self.rank = 0
        self.sent: list[tuple[Any, int]] = []
        self.inbox: list[Any] = []

    def try_receive(self) -> Any:
        return self.inbox.pop(0) if self.inbox else None

    async def receive(self) -> Any:
        raise TransportClosed("polled only")

    def send_encoded_nowait(self, route: Any, data: bytes) -> None:
        if route == b"hostile":
            raise WouldBlock("full")
        self.sent.append((route, self.codec.decode(data).id))

    def heartbeat_routes(self) -> list[Any]:
        return []


def test_poll_mode_replies_to_a_full_route_are_bounded_and_do_not_hold_up_others() -> None:
    transport = _FullRouteTransport()
    ep = EngineEndpoint(transport, heartbeat_interval=None, max_unread_replies=8)
    ep.register("echo", lambda v: v, payload_type=Any)
    codec = transport.codec
    n = 0
    for i in range(1, 101):
        transport.inbox.append(Received(Request(i, 0, "echo", codec.encode_value(i), client=1),
                                        route=b"hostile"))
        if i % 10 == 0:
            n += 1
            transport.inbox.append(Received(Request(n, 0, "echo", codec.encode_value(n),
                                                    client=2), route=b"legit"))
        ep.poll()
    print(f"outbox {ep.metrics()['outbox']}, dropped {ep.counters['replies_dropped_unread']}")
    assert transport.sent == [(b"legit", k) for k in range(1, 11)]
    assert ep.outbox_replies == 8
    assert ep.counters["replies_dropped_unread"] == 92


# -- a peer that floods requests and never reads its replies (real processes) ----------

import os  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import anyio  # noqa: E402
import pytest  # noqa: E402
import zmq  # noqa: E402

from ctlwire.kernel.app.engine_fleet import EngineFleet  # noqa: E402
from ctlwire.kernel.client.control_client import ControlClient  # noqa: E402
from ctlwire.transports.zmq_client import ZmqDealerClientTransport  # noqa: E402

PAYLOAD = "x" * 2048


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Flooder:
    """A raw DEALER (RCVHWM 1) that sends ``count`` echo requests with a 2 KiB
    payload as fast as the engine takes them and never calls recv. Samples the
    engine's RSS as it goes. Gives up when the engine stops taking requests for
    ``stuck_after`` s (an engine stuck behind this peer)."""

    def __init__(self, address: str, engine_pid: int, count: int, *,
                 stuck_after: float = 15.0) -> None:
        self.address = address
        self.pid = engine_pid
        self.count = count
        self.stuck_after = stuck_after
        self.sent = 0
        self.peak_rss = 0.0
        self.halfway = threading.Event()
        self.done = threading.Event()
        self.release = threading.Event()  # keep the connection (and its full pipe) until set
        self.stuck = False

    def run(self) -> None:
        codec = MsgpackCodec()
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.RCVHWM, 1)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.address)
        payload = codec.encode_value(PAYLOAD)
        last_progress = time.monotonic()
        try:
            while self.sent < self.count:
                frame = codec.encode(Request(self.sent + 1, 0, "echo", payload, client=666))
                try:
                    sock.send(frame, zmq.NOBLOCK)
                except zmq.Again:
                    if time.monotonic() - last_progress > self.stuck_after:
                        self.stuck = True
                        break
                    time.sleep(0.001)
                    continue
                last_progress = time.monotonic()
                self.sent += 1
                if self.sent % 2000 == 0:
                    self.peak_rss = max(self.peak_rss, rss_mb(self.pid))
                if self.sent == self.count * 3 // 4:  # the engine's pipe to us is full by now
                    self.halfway.set()
            self.done.set()
            self.release.wait(60)
        finally:
            self.halfway.set()
            self.peak_rss = max(self.peak_rss, rss_mb(self.pid))
            sock.close(0)
            ctx.term()
            self.done.set()


@pytest.mark.anyio
@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["poll", "serve"])
async def test_a_peer_that_never_reads_cannot_grow_the_engine_or_stall_other_clients(
        mode: str, tmp_path: Any) -> None:
    """An engine (engines bind) flooded with 2 KiB echo requests by a DEALER that
    never reads: every call of a legitimate client made during the flood
    succeeds, the engine's RSS stays bounded and the dropped replies are counted."""
    os.chmod(tmp_path, 0o700)
    address = f"ipc://{tmp_path}/e.sock"
    count = 80_000 if mode == "poll" else 40_000
    with EngineFleet(1, lambda r: ["--bind", address, "--mode", mode]) as fleet:
        pid = fleet.pids()[0]
        async with ControlClient(ZmqDealerClientTransport([address]), ranks=1) as client:
            assert await client.call("echo", "warm", rank=0, timeout=10) == "warm"
            base = rss_mb(pid)
            flood = Flooder(address, pid, count)
            flooder = threading.Thread(target=flood.run, daemon=True)
            flooder.start()
            await anyio.to_thread.run_sync(flood.halfway.wait)
            ok = 0
            failures: list[BaseException] = []
            for i in range(20):
                try:
                    assert await client.call("echo", i, rank=0, timeout=8) == i
                    ok += 1
                except Exception as exc:  # the assertion below reports it
                    failures.append(exc)
                    break
            await anyio.to_thread.run_sync(flood.done.wait)
            try:
                metrics = await client.call("metrics", rank=0, timeout=8) if not failures else {}
            finally:
                flood.release.set()
                flooder.join()
        print(f"\n{mode}: flood sent {flood.sent}/{count} (stuck={flood.stuck}), engine RSS "
              f"{base:.1f} MB -> peak {flood.peak_rss:.1f} MB; legit calls ok {ok}/20; "
              f"dropped unread {metrics.get('counters', {}).get('replies_dropped_unread')}, "
              f"outbox {metrics.get('outbox')}")
    assert not failures, failures
    assert ok == 20
    assert not flood.stuck and flood.sent == count
    assert metrics["counters"]["replies_dropped_unread"] > 0
    assert metrics["outbox"]["peak_bytes"] <= 4 << 20
    # libzmq's own pipes hold at most SNDHWM + RCVHWM messages per connection, both
    # sized from the frame limit on an engine (tests/kernel/test_peer_byte_bounds.py);
    # the engine's outbox adds at most its 4 MiB bound. Unbounded, the outbox alone
    # grows by ~130 MB here.
    assert flood.peak_rss - base < 100, (base, flood.peak_rss)


# -- the engine's client route table (engines bind) --------------------------------------

from ctlwire.transports.envelope import Heartbeat  # noqa: E402
from ctlwire.transports.zmq_engine import ZmqRouterEngineTransport  # noqa: E402


def _drain(transport: ZmqRouterEngineTransport, expect: int) -> int:
    got = 0
    while got < expect and transport.wait_readable(10):
        while transport.try_receive() is not None:
            got += 1
    return got


@pytest.mark.parametrize("junk", ["garbage", "valid_heartbeats"])
def test_junk_identities_cannot_evict_a_live_client_route(junk: str, tmp_path: Any) -> None:
    """150 raw DEALERs with distinct identities send garbage (or even valid
    heartbeats) after a real client: the real client's route stays in the
    table, garbage-only routes never enter it, surplus live ones are refused
    and counted."""
    os.chmod(tmp_path, 0o700)
    address = f"ipc://{tmp_path}/e.sock"
    codec = MsgpackCodec()
    # the route table is under test here, not the connection bound: room for all 151
    transport = ZmqRouterEngineTransport(address, 0, max_clients=64, max_connections=256)
    transport.open()
    ctx = zmq.Context()
    socks = []
    try:
        real = ctx.socket(zmq.DEALER)
        real.setsockopt(zmq.IDENTITY, b"real-client")
        real.setsockopt(zmq.LINGER, 0)
        real.connect(address)
        socks.append(real)
        real.send(codec.encode(Heartbeat(-1, 7, 1)))
        assert _drain(transport, 1) == 1
        hb = codec.encode(Heartbeat(-1, 9, 1))
        for i in range(150):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.IDENTITY, b"junk-%d" % i)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(address)
            s.send(b"\xff\x00garbage" if junk == "garbage" else hb)
            socks.append(s)
        assert _drain(transport, 150) == 150
        routes = list(transport.heartbeat_routes())
        print(f"\n{junk}: routes {len(routes)}, refused {transport.routes_refused}, "
              f"junk frames {transport.junk_routes}")
        assert b"real-client" in routes
        assert len(routes) <= 64
        if junk == "garbage":
            assert routes == [b"real-client"]
            assert transport.junk_routes == 150
        else:
            assert transport.routes_refused == 150 - 63
    finally:
        for s in socks:
            s.close(0)
        transport.close()
        ctx.term()


# -- impersonation under CURVE: a rank is bound to its key ------------------------------

from ctlwire.kernel.errors import EngineDead, RequestTimedOut  # noqa: E402
from ctlwire.transports.curve import (  # noqa: E402
    CurveClientConfig,
    CurveServerConfig,
    KeyPair,
    generate_keypair,
)
from ctlwire.transports.zmq_client import ZmqRouterClientTransport  # noqa: E402
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport  # noqa: E402


class Forger:
    """A raw DEALER with rank 1's key claiming ``rank-0`` (and a ``beat-0``
    beacon): it answers every request it gets with a forged result, sends
    heartbeats and forged replies for ids it never saw."""

    def __init__(self, address: str, keys: KeyPair, server: bytes) -> None:
        self.address, self.keys, self.server = address, keys, server
        self.stop = threading.Event()
        self.requests = 0
        self.forged = 0

    def run(self) -> None:
        codec = MsgpackCodec()
        ctx = zmq.Context()
        socks = []
        try:
            for identity in (b"rank-0", b"beat-0"):
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.IDENTITY, identity)
                s.setsockopt(zmq.LINGER, 0)
                CurveClientConfig(self.keys, self.server).apply(s)
                s.connect(self.address)
                socks.append(s)
            req_sock, beat_sock = socks
            forged = codec.encode_value("forged")
            fake_id = 1
            while not self.stop.is_set():
                beat_sock.send(codec.encode(Heartbeat(0, 1 << 60, 1)))
                req_sock.send(codec.encode(Heartbeat(0, 1 << 60, 1)))
                req_sock.send(codec.encode(Reply(fake_id, 0, 1 << 60, True, forged)))
                fake_id += 1
                self.forged += 1
                if req_sock.poll(50):
                    env = codec.decode(req_sock.recv())
                    if isinstance(env, Request):
                        self.requests += 1
                        req_sock.send(codec.encode(Reply(env.id, 0, 1 << 60, True, forged)))
                        self.forged += 1
        finally:
            for s in socks:
                s.close(0)
            ctx.term()


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_under_curve_a_rank_speaks_only_with_its_own_key() -> None:
    """Rank 1's key connecting as ``rank-0``/``beat-0`` gets nothing accepted: its
    requests' forged replies, heartbeats and unsolicited replies are dropped
    and counted (``dropped_impersonation``); rank 0 with its own key works."""
    server, key0, key1 = generate_keypair(), generate_keypair(), generate_keypair()
    curve = CurveServerConfig.allowing(server, ranks={0: key0.public, 1: key1.public})
    transport = ZmqRouterClientTransport("tcp://127.0.0.1:0", curve=curve)
    async with ControlClient(transport, ranks=[0, 1]) as client:
        forger = Forger(transport.address, key1, server.public)
        thread = threading.Thread(target=forger.run, daemon=True)
        thread.start()
        try:
            results = []
            for i in range(3):
                try:
                    results.append(await client.call("echo", i, rank=0, timeout=1.0))
                except (RequestTimedOut, EngineDead):  # never routed to the forger
                    results.append("not served")
        finally:
            forger.stop.set()
            await anyio.to_thread.run_sync(thread.join)
        dropped = client.counters.get("dropped_impersonation", 0)
        print(f"\nforger: {forger.requests} requests reached it, {forger.forged} forged frames "
              f"sent; results {results}; dropped_impersonation {dropped}")
        assert "forged" not in results
        assert forger.requests == 0  # rank 0's route is never a connection of key 1
        assert dropped >= forger.forged > 0
        assert client.registry.stats.unknown == 0  # nothing forged reached the registry
        # rank 0 with its own key: served
        engine = EngineEndpoint(ZmqDealerEngineTransport(
            transport.address, 0, curve=CurveClientConfig(key0, server.public)))
        engine.register("echo", lambda v: v, payload_type=Any)
        async with anyio.create_task_group() as tg:
            await tg.start(engine.serve)
            assert await client.call("echo", "real", rank=0, timeout=10) == "real"
            tg.cancel_scope.cancel()
