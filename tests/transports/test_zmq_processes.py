"""Real engine processes over real ZeroMQ sockets (ipc and tcp on loopback), both backends."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import zmq

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.errors import EngineDead, RemoteError, RequestTimedOut
from ctlwire.testing import free_tcp_address
from ctlwire.transports.codec import DEFAULT_MAX_MESSAGE_SIZE, MsgpackCodec, PickleCodec
from ctlwire.transports.curve import (
    CurveClientConfig,
    CurveServerConfig,
    generate_keypair,
    load_keypair,
    write_keypair,
)
from ctlwire.transports.envelope import Heartbeat, Reply, Request
from ctlwire.transports.errors import PickleRefused
from ctlwire.transports.zmq_client import ZmqDealerClientTransport, ZmqRouterClientTransport
from ctlwire.transports.zmq_config import beacon_address_for, remove_ipc_file
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]




@pytest.fixture(scope="module")
def ipc_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, EngineFleet]]:
    """Four poll-mode engines dialing one ipc address; each test's client binds it."""
    d = tmp_path_factory.mktemp("ipc")
    os.chmod(d, 0o700)
    address = f"ipc://{d}/control.sock"
    with EngineFleet(4, lambda r: ["--connect", address]) as fleet:
        yield address, fleet
    assert not any(e.alive for e in fleet.engines.values())


async def client_for(address: str, n: int = 4, **kw: Any) -> ControlClient:
    insecure = address.startswith("tcp://")  # loopback tcp without CURVE, opted into
    return ControlClient(ZmqRouterClientTransport(address, allow_insecure_tcp=insecure),
                         ranks=n, default_timeout=10.0, **kw)


async def test_ipc_call_and_fan_out_to_four_ranks(ipc_fleet: tuple[str, EngineFleet]) -> None:
    address, fleet = ipc_fleet
    async with await client_for(address) as c:
        await c.wait_ready(timeout=10)
        assert (await c.call("pid", rank=2)) == fleet.engines[2].pid
        res = await c.fan_out("echo", {"x": [1, 2]})
        assert res.results == {r: {"x": [1, 2]} for r in range(4)}
        pids = await c.fan_out("pid", mode="watching")
        assert pids.results == fleet.pids()
        with pytest.raises(RemoteError) as info:
            await c.call("fail", "nope", rank=3)
        assert info.value.type_name == "RuntimeError" and info.value.rank == 3
        assert c.registry.live_count == 0


async def test_concurrent_queueing_and_watching_callers(ipc_fleet: tuple[str, EngineFleet]
                                                        ) -> None:
    address, _ = ipc_fleet
    async with await client_for(address) as c:
        await c.wait_ready(timeout=10)
        order: list[int] = []
        watched: list[Any] = []

        async def queued(i: int) -> None:
            res = await c.fan_out("echo", i)
            assert res.results == {r: i for r in range(4)}
            order.append(i)

        async def watcher() -> None:
            watched.append((await c.fan_out("nap", 0.05, mode="watching")).results)

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(queued, i)
            for _ in range(10):
                tg.start_soon(watcher)
        assert sorted(order) == list(range(20))
        assert c.mailbox("echo").queue.admitted_total == 20
        assert all(w == {r: 0.05 for r in range(4)} for w in watched) or all(
            isinstance(w, dict) for w in watched)
        assert c.registry.live_count == 0


async def test_timeout_then_late_reply_is_dropped_and_counted(
        ipc_fleet: tuple[str, EngineFleet]) -> None:
    address, _ = ipc_fleet
    async with await client_for(address) as c:
        await c.wait_ready(timeout=10)
        with pytest.raises(RequestTimedOut):
            await c.call("sleep", 0.6, rank=1, timeout=0.2)
        with anyio.fail_after(5):
            while c.registry.stats.late < 1:
                await anyio.sleep(0.05)
        assert c.registry.stats.late == 1 and c.registry.live_count == 0
        assert await c.call("echo", "still serving", rank=1) == "still serving"
        # a busy beat taken before the late reply may land after it: the next idle one clears it
        with anyio.fail_after(5):
            while c.peers.state(1).name != "CONNECTED":
                await anyio.sleep(0.05)


async def test_kill_minus_nine_fails_pending_call_with_engine_dead(tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/control.sock"
    with EngineFleet(3, lambda r: ["--connect", address, "--mode", "serve"]) as fleet:
        async with await client_for(address, 3) as c:
            await c.wait_ready(timeout=10)
            got: dict[str, Any] = {}

            async def pending() -> None:
                start = anyio.current_time()
                try:
                    await c.call("hang", rank=1, timeout=30.0)
                except EngineDead as exc:
                    got["error"] = exc
                got["after"] = anyio.current_time() - start

            async with anyio.create_task_group() as tg:
                tg.start_soon(pending)
                await anyio.sleep(0.2)
                fleet.kill(1, signal.SIGKILL)
            assert isinstance(got["error"], EngineDead) and got["error"].rank == 1
            assert got["after"] < 3.0  # liveness bound is about 1 s, the timeout 30 s
            res = await c.fan_out("echo", "x")
            assert res.results == {0: "x", 2: "x"} and isinstance(res.errors[1], EngineDead)
            assert c.registry.live_count == 0
            # the restarted rank rejoins under a new incarnation and serves again
            old = fleet.engines[1].incarnation
            fleet.restart(1)
            await c.wait_ready(timeout=10)
            assert c.peers.peers[1].incarnation == fleet.engines[1].incarnation != old
            assert await c.call("echo", "back", rank=1) == "back"


async def test_reverse_orientation_engines_bind(tmp_path: Path) -> None:
    addrs = {r: f"ipc://{tmp_path}/engine-{r}.sock" for r in range(2)}
    with EngineFleet(2, lambda r: ["--bind", addrs[r]]) as fleet:
        async with ControlClient(ZmqDealerClientTransport(addrs), ranks=2) as c:
            await c.wait_ready(timeout=10)
            assert (await c.fan_out("pid")).results == fleet.pids()
            fleet.kill(0)
            with pytest.raises(EngineDead):
                await c.call("hang", rank=0, timeout=30.0)
            assert await c.call("echo", 5, rank=1) == 5
            assert c.registry.live_count == 0


async def test_tcp_loopback_fan_out() -> None:
    address = free_tcp_address()
    with EngineFleet(2, lambda r: ["--connect", address, "--allow-insecure-tcp"]) as _fleet:
        async with await client_for(address, 2) as c:
            await c.wait_ready(timeout=10)
            res = await c.fan_out("echo", b"bytes")
            assert res.results == {0: b"bytes", 1: b"bytes"}


async def test_curve_allow_listed_engine_works_unknown_key_gets_nothing(tmp_path: Path
                                                                      ) -> None:
    keys = tmp_path / "keys"
    write_keypair(keys, "server")
    write_keypair(keys, "engine")
    write_keypair(keys, "intruder")
    server = load_keypair(keys / "server.key_secret")
    allowed = load_keypair(keys / "engine.key_secret").public
    address = free_tcp_address()

    def args(rank: int) -> list[str]:
        who = "engine" if rank == 0 else "intruder"
        return ["--connect", address, "--curve-secret", str(keys / f"{who}.key_secret"),
                "--curve-server-key", str(keys / "server.key")]

    transport = ZmqRouterClientTransport(
        address, curve=CurveServerConfig.allowing(server, ranks={0: allowed}))
    with EngineFleet(2, args):
        async with ControlClient(transport, ranks=2) as c:
            await c.wait_ready([0], timeout=10)
            assert await c.call("echo", "secret", rank=0) == "secret"
            with pytest.raises(RequestTimedOut):
                await c.wait_ready([1], timeout=1.0)
            with pytest.raises(EngineDead):  # never heard from: waited for, up to the deadline
                await c.call("echo", "x", rank=1, timeout=1.0)
            assert transport.auth_rejections >= 1
            assert c.peers.state(1).name == "UNKNOWN"


def test_pickle_refused_on_plain_tcp() -> None:
    codec = PickleCodec(allow_pickle=True)
    with pytest.raises(PickleRefused, match="CURVE"):
        ZmqRouterClientTransport("tcp://127.0.0.1:5999", codec=codec, allow_insecure_tcp=True)
    with pytest.raises(PickleRefused):
        ZmqDealerEngineTransport("tcp://127.0.0.1:5999", 0, codec=codec,
                                 allow_insecure_tcp=True)
    with pytest.raises(PickleRefused):
        PickleCodec()
    # allowed on ipc (owner-only socket file) and on tcp with CURVE
    ZmqRouterClientTransport(codec=codec)
    curve = CurveClientConfig(generate_keypair(), generate_keypair().public)
    ZmqDealerEngineTransport("tcp://127.0.0.1:5999", 0, codec=codec, curve=curve).close()


async def test_bad_frames_from_a_raw_socket_are_answered_or_counted(tmp_path: Path) -> None:
    """A raw pyzmq ROUTER plays the client: malformed, oversized, wrong-type and
    unknown-method frames, then a good request that must still be served."""
    address = f"ipc://{tmp_path}/raw.sock"
    codec = MsgpackCodec()
    ctx = zmq.Context()
    raw = ctx.socket(zmq.ROUTER)
    raw.setsockopt(zmq.RCVTIMEO, 5000)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.ROUTER_MANDATORY, 1)
    raw.bind(address)
    try:
        with EngineFleet(1, lambda r: ["--connect", address]):
            ident = b"rank-0"

            def recv_envelope() -> Any:
                for _ in range(100):
                    _, data = raw.recv_multipart()
                    env = codec.decode(data)
                    if not isinstance(env, Heartbeat):
                        return env
                raise AssertionError("only heartbeats arrived")

            # the engine is connected once its first heartbeat arrives
            _, first = raw.recv_multipart()
            assert isinstance(codec.decode(first), Heartbeat)

            def request(rid: int, method: str, payload: Any = None) -> bytes:
                return codec.encode(Request(rid, 0, method, codec.encode_value(payload)))

            big = DEFAULT_MAX_MESSAGE_SIZE + 10  # above the codec's limit, below MAXMSGSIZE
            raw.send_multipart([ident, b"\xc1 not msgpack"])
            raw.send_multipart([ident, msgspec.msgpack.encode(["q", 11, 0, "echo", 1, "x"])])
            raw.send_multipart([ident, b"\x00" * big])
            raw.send_multipart([ident, codec.encode(Reply(3, 0, 1, True, codec.encode_value(1)))])
            raw.send_multipart([ident, request(12, "no_such_method")])
            raw.send_multipart([ident, request(13, "echo", "good")])
            raw.send_multipart([ident, request(14, "metrics")])
            got = [recv_envelope() for _ in range(4)]
            assert [(r.id, r.ok) for r in got] == [(11, False), (12, False), (13, True),
                                                   (14, True)]
            assert got[0].error.type == "MalformedFrame"
            assert got[1].error.type == "UnknownMethod"
            assert codec.decode_value(got[2].result) == "good"
            m = codec.decode_value(got[3].result)["counters"]
            assert m["dropped_malformed"] == 2 and m["dropped_oversized"] == 1
            assert m["dropped_wrong_type"] == 1
    finally:
        raw.close(0)
        ctx.term()


async def test_ipc_socket_file_is_owner_only_and_removed(tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/perm.sock"
    transport = ZmqRouterClientTransport(address)
    async with transport:
        mode = (tmp_path / "perm.sock").stat().st_mode & 0o777
        assert mode == 0o600
    assert not (tmp_path / "perm.sock").exists()
    default = ZmqRouterClientTransport()
    async with default:
        path = Path(default.address[len("ipc://"):])
        assert (path.parent.stat().st_mode & 0o777) == 0o700

    assert not path.exists() and not path.parent.exists()


async def test_closed_transport_cleans_up_once_and_leaves_nothing_to_its_collection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its private ipc directory goes on close; collecting it later runs no
    finalizer (which could otherwise fire at any stack depth, in any test)."""
    import gc

    import ctlwire.transports.zmq_client_base as base

    calls: list[str] = []

    def counted(address: str, *, private_dir: bool = False) -> None:
        calls.append(address)
        remove_ipc_file(address, private_dir=private_dir)

    monkeypatch.setattr(base, "remove_ipc_file", counted)
    transport = ZmqRouterClientTransport()
    async with transport:
        path = Path(transport.address[len("ipc://"):])
    assert not path.parent.exists()
    after_close = len(calls)
    assert after_close >= 1
    del transport
    gc.collect()
    assert len(calls) == after_close


def test_free_tcp_address_leaves_the_beacon_port_free_too() -> None:
    """An engine binding tcp://H:P binds its beacon at P+1: both must be free."""
    import socket

    for _ in range(20):
        address = free_tcp_address()
        port = int(address.rsplit(":", 1)[1])
        assert beacon_address_for(address) == f"tcp://127.0.0.1:{port + 1}"
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", port))
            b.bind(("127.0.0.1", port + 1))
