"""Liveness and incarnations come only from the peer authenticated for a rank: an
incarnation is bounded, a forged heartbeat believed only where nothing authenticates
(and that needs an explicit opt-in, see ``tests/transports/test_secure_defaults.py``).

Real engine processes; raw pyzmq sockets play the forging peer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest
import zmq

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.errors import EngineDead
from ctlwire.testing import free_tcp_address
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.curve import (
    CurveClientConfig,
    CurveServerConfig,
    KeyPair,
    RanksUnbound,
    load_keypair,
    write_keypair,
)
from ctlwire.transports.envelope import Envelope, Heartbeat, Reply, Request
from ctlwire.transports.zmq_client import ZmqDealerClientTransport, ZmqRouterClientTransport
from ctlwire.transports.zmq_config import (
    beacon_address_for,
    beacon_identity,
    new_identity_tag,
    rank_from_beacon_identity,
    rank_from_identity,
    rank_identity,
    request_route_of_beacon,
)

pytestmark = [pytest.mark.timeout(180)]

CODEC = MsgpackCodec()


async def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Until ``predicate()`` holds; fails the test after ``timeout`` s."""
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.02)


class Forger:
    """A raw DEALER per identity, each sending ``frames()`` every 20 ms from a thread
    until stopped (``keys``: CURVE with these keys against ``server``)."""

    def __init__(self, address: str, identities: list[bytes], frames: Callable[[], list[Envelope]],
                 *, keys: KeyPair | None = None, server: bytes = b"") -> None:
        self.address, self.identities, self.frames = address, identities, frames
        self.keys, self.server = keys, server
        self.stop = threading.Event()
        self.sent = 0  # taken by the socket (a refused handshake leaves nowhere to send)
        self.rounds = 0
        self.requests = 0  # requests that reached the forger (it answers each, forged)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        socks = []
        try:
            for identity in self.identities:
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.IDENTITY, identity)
                s.setsockopt(zmq.LINGER, 0)
                if self.keys is not None:
                    CurveClientConfig(self.keys, self.server).apply(s)
                s.connect(self.address)
                socks.append(s)
            while not self.stop.is_set():
                for s in socks:
                    for env in self.frames():
                        try:
                            s.send(CODEC.encode(env), zmq.NOBLOCK)
                            self.sent += 1
                        except zmq.Again:
                            pass
                self.rounds += 1
                for s in socks:
                    while s.poll(0):
                        env = CODEC.decode(s.recv())
                        if isinstance(env, Request):
                            self.requests += 1
                            s.send(CODEC.encode(Reply(env.id, env.rank, 1, True,
                                                      CODEC.encode_value("forged"))))
                self.stop.wait(0.02)
        finally:
            for s in socks:
                s.close(0)
            ctx.term()

    @contextmanager
    def running(self) -> Iterator[Forger]:
        self._thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            self._thread.join(10)


# -- incarnations: bounded, and only the authenticated peer's ----------------------------

@pytest.mark.anyio
async def test_a_forged_incarnation_from_the_future_does_not_fence_the_real_engine(
        anyio_backend: str) -> None:
    """Insecure tcp, opted into: a local peer can send a heartbeat as ``beat-0``. Before,
    one claiming incarnation ``2**64-1`` was admitted as a restart: the real engine's
    heartbeats and replies were stale from then on, for good (even after it restarted).
    Now an incarnation minted more than ``incarnation_window`` s in the future is refused
    and counted; the real engine, and its restart, are served."""
    transport = ZmqRouterClientTransport("tcp://127.0.0.1:0", allow_insecure_tcp=True)
    async with ControlClient(transport, ranks=1, default_timeout=20.0) as client:
        address = transport.address
        with EngineFleet(1, lambda r: ["--connect", address, "--allow-insecure-tcp"],
                         ready_timeout=60) as fleet:
            await client.wait_ready(timeout=30)
            real = fleet.engines[0].incarnation
            assert client.peers.peers[0].incarnation == real

            def forged() -> list[Envelope]:
                return [Heartbeat(0, 2**64 - 1, 1),
                        Heartbeat(0, 2**63, 2, 7, "echo", 1.0, 1),  # "busy": the other path
                        Heartbeat(0, real + (3600_000 << 12), 3)]  # an hour ahead
            with Forger(address, [b"beat-0"], forged).running():
                # refused and counted, or (the failure) admitted
                await wait_for(lambda: client.counters["implausible_incarnation"] >= 6
                               or client.peers.peers[0].incarnation != real)
            assert client.peers.peers[0].incarnation == real
            assert await client.call("echo", "still me", rank=0) == "still me"
            assert client.peers.peers[0].incarnation == real
            assert client.counters["engine_restarted"] == 0
            fleet.kill(0)
            restarted = await anyio.to_thread.run_sync(fleet.restart, 0)
            await wait_for(lambda: client.peers.peers[0].incarnation == restarted.incarnation)
            assert await client.call("echo", "restarted", rank=0) == "restarted"
        assert client.metrics()["counters"]["implausible_incarnation"] >= 6


def _curve_keys(tmp_path: Path) -> Path:
    keys = tmp_path / "keys"
    for name in ("server", "rank0", "rank1", "stranger"):
        write_keypair(keys, name)
    return keys


@pytest.mark.anyio
async def test_after_kill_9_forged_heartbeats_cannot_keep_the_rank_alive_by_default(
        anyio_backend: str, tmp_path: Path) -> None:
    """The secure default for tcp (CURVE, each rank bound to its key): after ``kill -9``
    of rank 0, a stranger's key and rank 1's key sending ``beat-0``/``rank-0``
    heartbeats with rank 0's real incarnation get nothing believed: rank 0 is Lost
    and a call fails as EngineDead instead of waiting for its deadline. The
    stranger is refused at the handshake, rank 1's key per frame; both counted."""
    keys = _curve_keys(tmp_path)
    server = load_keypair(keys / "server.key_secret")
    ranks = {r: load_keypair(keys / f"rank{r}.key_secret").public for r in (0, 1)}
    transport = ZmqRouterClientTransport(
        "tcp://127.0.0.1:0", curve=CurveServerConfig.allowing(server, ranks=ranks))
    async with ControlClient(transport, ranks=2, default_timeout=60.0) as client:
        address = transport.address
        args = ["--connect", address, "--curve-secret", str(keys / "rank0.key_secret"),
                "--curve-server-key", str(keys / "server.key")]
        with EngineFleet(1, lambda r: args, ready_timeout=60) as fleet:
            await client.wait_ready([0], timeout=30)
            real = fleet.engines[0].incarnation

            def beats() -> list[Envelope]:
                return [Heartbeat(0, real, 1)]
            identities = [b"beat-0", b"rank-0"]
            insider = Forger(address, identities, beats,
                             keys=load_keypair(keys / "rank1.key_secret"), server=server.public)
            stranger = Forger(address, identities, beats,
                              keys=load_keypair(keys / "stranger.key_secret"),
                              server=server.public)
            with insider.running(), stranger.running():
                await wait_for(lambda: insider.sent > 20 and stranger.rounds > 20)
                fleet.kill(0)
                await wait_for(lambda: client.peers.state(0).name == "LOST")
                sent_before = insider.sent
                await wait_for(lambda: insider.sent > sent_before + 20)  # still forging
                assert client.peers.state(0).name == "LOST"
                with pytest.raises(EngineDead):
                    await client.call("echo", "anyone?", rank=0)
        assert client.counters.get("dropped_impersonation", 0) > 0
        assert transport.auth_rejections > 0
        assert client.metrics()["auth_rejections"] == transport.auth_rejections


# -- a rank's route belongs to the key bound to the rank ---------------------------------

def test_tagged_identities_name_their_rank_and_nothing_else_does() -> None:
    tag = new_identity_tag()
    assert len(tag) == 16 and tag != new_identity_tag()
    assert rank_identity(3, tag) == b"rank-3." + tag
    assert rank_from_identity(rank_identity(3, tag)) == 3
    assert rank_from_beacon_identity(beacon_identity(3, tag)) == 3
    assert request_route_of_beacon(beacon_identity(3, tag)) == rank_identity(3, tag)
    assert rank_from_identity(b"rank-3") == 3
    for bad in (b"rank-3.", b"rank-3.XYZ", b"rank-3." + b"a" * 33, b"rank-03.ab",
                b"rank-3.ab.cd", b"rank-.ab", b"rank-3.ab\x00"):
        assert rank_from_identity(bad) is None, bad



@pytest.mark.anyio
async def test_a_holder_of_another_ranks_key_cannot_take_a_ranks_route(
        anyio_backend: str, tmp_path: Path) -> None:
    """CURVE with ranks bound to keys. Before: rank 1's key connecting as ``rank-0``
    took rank 0's route (``ROUTER_HANDOVER``) and received its requests; its forged
    replies were dropped, so calls to the real rank 0 timed out. libzmq's ZAP request
    carries the server's own identity, not the one a peer asks for, so the handshake
    cannot refuse it; instead rank 0's requests go only to the tagged identity last
    heard authenticated with rank 0's key: every call reaches the real engine, none
    the impostor, whose frames are dropped and counted."""
    keys = _curve_keys(tmp_path)
    server = load_keypair(keys / "server.key_secret")
    ranks = {r: load_keypair(keys / f"rank{r}.key_secret").public for r in (0, 1)}
    transport = ZmqRouterClientTransport(
        "tcp://127.0.0.1:0", curve=CurveServerConfig.allowing(server, ranks=ranks))
    async with ControlClient(transport, ranks=2, default_timeout=10.0) as client:
        address = transport.address
        args = ["--connect", address, "--curve-secret", str(keys / "rank0.key_secret"),
                "--curve-server-key", str(keys / "server.key")]
        with EngineFleet(1, lambda r: args, ready_timeout=60) as fleet:
            await client.wait_ready([0], timeout=30)
            real = fleet.engines[0].incarnation

            def beats() -> list[Envelope]:
                return [Heartbeat(0, real, 1)]
            impostor = Forger(address, [b"rank-0", b"beat-0", b"rank-0.0123456789abcdef"],
                              beats, keys=load_keypair(keys / "rank1.key_secret"),
                              server=server.public)
            with impostor.running():
                # the impostor is connected under rank 0's identities and heard
                await wait_for(lambda: client.counters.get("dropped_impersonation", 0) > 30)
                results = []
                for i in range(10):
                    results.append(await client.call("echo", i, rank=0))
                    # its reconnects keep trying to take the route over meanwhile
                    await anyio.sleep(0.05)
            assert results == list(range(10))
            assert impostor.requests == 0
            assert client.peers.peers[0].incarnation == real
            assert client.peers.state(0).name == "CONNECTED"
        assert client.counters["dropped_impersonation"] > 30
        assert transport.counters["impersonation"] > 30


class BoundImpostor:
    """A CURVE server with ``keys`` at an engine's addresses (a ROUTER at ``address``,
    a PUB at its beacon address): heartbeats for rank 0 every 20 ms on both, a forged
    reply to every request."""

    def __init__(self, address: str, keys: KeyPair, incarnation: int) -> None:
        self.address, self.keys, self.incarnation = address, keys, incarnation
        self.stop = threading.Event()
        self.bound = threading.Event()
        self.rounds = 0
        self.requests = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        router, pub = ctx.socket(zmq.ROUTER), ctx.socket(zmq.PUB)
        try:
            routes: set[bytes] = set()
            for sock, address in ((router, self.address),
                                  (pub, beacon_address_for(self.address))):
                sock.setsockopt(zmq.LINGER, 0)
                CurveServerConfig(self.keys).apply(sock)
                assert address is not None
                sock.bind(address)
            self.bound.set()
            seq = 0
            while not self.stop.is_set():
                seq += 1
                beat = CODEC.encode(Heartbeat(0, self.incarnation, seq))
                pub.send(beat)
                for route in routes:
                    router.send_multipart([route, beat], zmq.NOBLOCK)
                while router.poll(0):
                    route, data = router.recv_multipart()
                    routes.add(route)
                    env = CODEC.decode(data)
                    if isinstance(env, Request):
                        self.requests += 1
                        router.send_multipart([route, CODEC.encode(Reply(
                            env.id, 0, self.incarnation, True, CODEC.encode_value("forged")))])
                self.rounds += 1
                self.stop.wait(0.02)
        finally:
            router.close(0)
            pub.close(0)
            ctx.term()

    @contextmanager
    def running(self) -> Iterator[BoundImpostor]:
        self._thread.start()
        assert self.bound.wait(30)
        try:
            yield self
        finally:
            self.stop.set()
            self._thread.join(10)


@pytest.mark.anyio
async def test_engines_that_bind_are_believed_only_with_their_own_server_key(
        anyio_backend: str, tmp_path: Path) -> None:
    """Engines bind, the client connects with a server key per rank. After ``kill -9``
    of rank 0, the holder of rank 1's engine key binds rank 0's addresses and sends
    heartbeats and forged replies as rank 0: the client's handshake with it fails
    (it cannot prove rank 0's key), so rank 0 stays Lost and a call fails as
    EngineDead; rank 1 is unaffected. One server key shared by the ranks (the only
    form before) needs an explicit ``any_rank=True``."""
    keys = _curve_keys(tmp_path)
    write_keypair(keys, "client")
    client_keys = load_keypair(keys / "client.key_secret")
    engine_keys = {r: load_keypair(keys / f"rank{r}.key_secret") for r in (0, 1)}
    addresses = [free_tcp_address() for _ in (0, 1)]
    with pytest.raises(RanksUnbound):
        ZmqDealerClientTransport(addresses, curve=CurveClientConfig(
            client_keys, engine_keys[0].public))
    transport = ZmqDealerClientTransport(addresses, curve=CurveClientConfig.for_ranks(
        client_keys, {r: k.public for r, k in engine_keys.items()}))

    def args(rank: int) -> list[str]:
        return ["--bind", addresses[rank], "--curve-secret", str(keys / f"rank{rank}.key_secret"),
                "--curve-allow", str(keys / "client.key")]
    with EngineFleet(2, args, ready_timeout=60) as fleet:
        async with ControlClient(transport, ranks=2, default_timeout=30.0) as client:
            await client.wait_ready(timeout=30)
            assert await client.call("echo", "real", rank=0) == "real"
            real = fleet.engines[0].incarnation
            fleet.kill(0)
            await wait_for(lambda: client.peers.state(0).name == "LOST")
            impostor = BoundImpostor(addresses[0], engine_keys[1], real)
            with impostor.running():
                await wait_for(lambda: impostor.rounds > 50)  # a second of forging, at least
                assert client.peers.state(0).name == "LOST"
                with pytest.raises(EngineDead):
                    await client.call("echo", "anyone?", rank=0)
                assert await client.call("echo", "fine", rank=1) == "fine"
            assert impostor.requests == 0
