"""Hostile peers, transport level: whatever a process that can reach a socket
sends, it must not abort a ctlwire process, make it run code, hang it, or grow its memory
without bound.

Real engine processes and raw pyzmq sockets play the hostile peer where the finding is
about processes and sockets.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest
import zmq

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.testing import free_tcp_address, free_tcp_port
from ctlwire.transports.codec import JsonCodec, MsgpackCodec, PickleCodec
from ctlwire.transports.curve import CurveClientConfig, generate_keypair
from ctlwire.transports.envelope import Heartbeat, Reply, Request
from ctlwire.transports.errors import EndpointError, PickleRefused
from ctlwire.transports.ipc_path import IpcPathUnsafe, secure_ipc_file
from ctlwire.transports.memory import decode_event
from ctlwire.transports.transport import Dropped, Received
from ctlwire.transports.zmq_client import (
    ZmqDealerClientTransport,
    ZmqPairClientTransport,
    ZmqPushPullClientTransport,
    ZmqRouterClientTransport,
)
from ctlwire.transports.zmq_config import InsecureBind, ZmqOptions
from ctlwire.transports.zmq_engine import (
    ZmqDealerEngineTransport,
    ZmqPairEngineTransport,
    ZmqPushPullEngineTransport,
    ZmqRouterEngineTransport,
)

pytestmark = [pytest.mark.timeout(180)]

CODEC = MsgpackCodec()




def request(rid: int, method: str, value: object) -> bytes:
    return CODEC.encode(Request(rid, 0, method, CODEC.encode_value(value)))


def address_for(proto: str, tmp_path: Path) -> str:
    if proto == "ipc":
        os.chmod(tmp_path, 0o700)
        return f"ipc://{tmp_path}/engine.sock"
    return free_tcp_address()


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def await_reply(sock: zmq.Socket[bytes], rid: int, timeout: float,
                routed: bool = False) -> Reply:
    """The Reply with id ``rid`` (heartbeats and other replies skipped)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not sock.poll(int(max(0.0, end - time.monotonic()) * 1000) + 1):
            break
        frames = sock.recv_multipart()
        env = CODEC.decode(frames[-1])
        if isinstance(env, Reply) and env.id == rid:
            return env
    raise AssertionError(f"no reply to request {rid} within {timeout} s")


# -- finding 1: a full receive pipe plus a disconnect must not abort the process ----------

FLOOD = 30_000  # frames: far more than RCVHWM, whatever it is configured to


@pytest.mark.parametrize(("mode", "proto", "orientation"), [
    ("poll", "ipc", "engine_binds"), ("poll", "tcp", "engine_binds"),
    ("serve", "ipc", "engine_binds"), ("serve", "tcp", "engine_binds"),
    ("poll", "ipc", "engine_dials"),
])
def test_flood_past_rcvhwm_then_disconnect_does_not_abort_the_engine(
        tmp_path: Path, ctx: zmq.Context[zmq.Socket[bytes]], mode: str, proto: str,
        orientation: str) -> None:
    """The recipe of libzmq #4364/#4767: while the engine's handler blocks, a peer queues
    far more frames than RCVHWM and disconnects. With ZMTP heartbeats on, libzmq aborted
    the engine (SIGABRT, 6 of 6 trials); it must stay alive and answer a new peer."""
    address = address_for(proto, tmp_path)
    insecure = ["--allow-insecure-tcp"] if proto == "tcp" else []
    if orientation == "engine_binds":
        args = ["--bind", address, "--mode", mode, *insecure]
        hostile = None
    else:
        hostile = ctx.socket(zmq.ROUTER)
        hostile.bind(address)
        args = ["--connect", address, "--mode", mode]
    with EngineFleet(1, lambda r: args) as fleet:
        engine = fleet.engines[0]
        if hostile is None:
            peer = ctx.socket(zmq.DEALER)
            peer.connect(address)

            def send(frame: bytes) -> None:
                peer.send(frame)
        else:
            peer = hostile
            assert peer.poll(30_000)  # the engine's first heartbeat: it is connected
            peer.recv_multipart()

            def send(frame: bytes) -> None:
                peer.send_multipart([b"rank-0", frame])
        peer.setsockopt(zmq.SNDHWM, 0)  # the hostile peer queues without limit
        send(request(1, "sleep", 2.0))  # the handler blocks the engine's thread
        time.sleep(0.3)
        for i in range(FLOOD):
            send(request(100 + i, "echo", i))
        time.sleep(0.5)  # let libzmq push the flood into the engine's pipe
        peer.close(linger=0)  # ... and go away while the pipe is full
        # a new peer is answered once the engine has worked through the flood
        if orientation == "engine_binds":
            fresh = ctx.socket(zmq.DEALER)
            fresh.connect(address)
            fresh.send(request(10**9, "echo", "still here"))
        else:
            fresh = ctx.socket(zmq.ROUTER)
            fresh.setsockopt(zmq.ROUTER_MANDATORY, 1)
            fresh.bind(address)
            while True:  # until the engine's request connection (rank-0) is back
                assert engine.alive, f"engine exited with {engine.proc.returncode}"
                try:
                    fresh.send_multipart([b"rank-0", request(10**9, "echo", "still here")])
                    break
                except zmq.ZMQError as exc:
                    assert exc.errno == zmq.EHOSTUNREACH
                    time.sleep(0.05)
        reply = await_reply(fresh, 10**9, timeout=90.0)
        assert reply.ok and CODEC.decode_value(reply.result) == "still here"
        assert engine.alive, f"engine exited with {engine.proc.returncode}"
        fresh.close(linger=0)
    assert engine.proc.returncode == 0  # a clean exit on SIGTERM, not SIGABRT (-6)


# -- finding 2: pickle only where every peer is authenticated ----------------------------

def _pickle_codec() -> PickleCodec:
    return PickleCodec(allow_pickle=True)


def _every_class(address: str, other: str) -> list[Callable[[], object]]:
    """One constructor per transport class and socket, ``address`` in the position
    under test (``other`` a harmless inproc address elsewhere). Insecure tcp and
    abstract ipc are opted into: what is under test here is the pickle rule."""
    ctx = zmq.Context.instance()
    c = _pickle_codec
    ok: dict[str, bool] = {"allow_insecure_tcp": True, "allow_abstract_ipc": True}
    return [
        lambda: ZmqRouterClientTransport(address, codec=c(), **ok),
        lambda: ZmqDealerClientTransport([address], codec=c(), **ok),
        lambda: ZmqPushPullClientTransport([address], other, codec=c(), **ok),
        lambda: ZmqPushPullClientTransport([other], address, codec=c(), **ok),
        lambda: ZmqPairClientTransport([address], context=ctx, codec=c(), **ok),
        lambda: ZmqDealerEngineTransport(address, 0, codec=c(), **ok),
        lambda: ZmqRouterEngineTransport(address, 0, codec=c(), **ok),
        lambda: ZmqPushPullEngineTransport(address, other, 0, codec=c(), **ok),
        lambda: ZmqPushPullEngineTransport(other, address, 0, codec=c(), **ok),
        lambda: ZmqPairEngineTransport(address, 0, context=ctx, codec=c(), **ok),
    ]


def _unsafe_addresses(tmp_path: Path) -> dict[str, str]:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)  # others may traverse: the socket file is not private
    return {
        "abstract ipc": "ipc://@ctlwire-hostile-test",
        "tcp loopback": free_tcp_address(),
        "tcp ipv6 loopback": free_tcp_address("::1"),
        "tipc": "tipc://{5560,0,0}",
        "ipc in a 0755 directory": f"ipc://{shared}/s.sock",
    }


def test_pickle_refused_on_every_unauthenticated_channel_of_every_class(tmp_path: Path) -> None:
    """Before: pickle was accepted on abstract ipc, the PushPull reply address and the
    Pair engine over tcp, and tipc; the client would unpickle any PUSH."""
    refused = 0
    for what, address in _unsafe_addresses(tmp_path).items():
        for i, make in enumerate(_every_class(address, "inproc://ctlwire-other")):
            with pytest.raises(PickleRefused):
                transport = make()
                raise AssertionError(f"{what}, constructor {i}: accepted {transport!r}")
            refused += 1
    assert refused == 50


def test_pickle_allowed_where_every_peer_is_authenticated(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    codec = _pickle_codec()
    for address in (f"ipc://{tmp_path}/p.sock", "inproc://ctlwire-pickle-ok"):
        for make in _every_class(address, "inproc://ctlwire-other"):
            transport = make()
            close = getattr(transport, "close", None)
            if close is not None:
                close()
    curve = CurveClientConfig(generate_keypair(), generate_keypair().public)
    ZmqDealerEngineTransport(free_tcp_address(), 0, codec=codec,
                             curve=curve).close()


# -- finding 5: a failed bind or connect raises a typed error and never hangs ------------

def _close_returns(close: Callable[[], object]) -> None:
    """``close`` (which terminates the transport's own context) must return; before,
    ``Context.term()`` blocked for ever on the socket the failed bind left open."""
    done = threading.Event()

    def run() -> None:
        close()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(30), "close() hung: a socket was left open"


def test_engine_bind_on_a_port_in_use_raises_and_closes(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        for engine in (ZmqRouterEngineTransport(address, 0, allow_insecure_tcp=True),
                       ZmqPushPullEngineTransport(address, "inproc://x", 0,
                                                  allow_insecure_tcp=True)):
            with pytest.raises(EndpointError) as info:
                engine.open()
            assert info.value.operation == "bind" and info.value.address == address
            _close_returns(engine.close)
            assert engine.closed


def test_engine_connect_without_a_port_raises_and_closes() -> None:
    engine = ZmqDealerEngineTransport("tcp://127.0.0.1", 0, allow_insecure_tcp=True)
    with pytest.raises(EndpointError) as info:
        engine.open()
    assert info.value.operation == "connect"
    _close_returns(engine.close)


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_client_bind_or_connect_failure_raises_typed_without_freezing_the_loop(
        anyio_backend: str) -> None:
    """Before: the PushPull client's reply bind on a port in use, and the Dealer client
    with no port, froze the whole event loop in ``Context.term()``."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        clients = [ZmqPushPullClientTransport(["inproc://ctlwire-r0"], address,
                                              allow_insecure_tcp=True),
                   ZmqRouterClientTransport(address, allow_insecure_tcp=True),
                   ZmqDealerClientTransport(["tcp://127.0.0.1"], allow_insecure_tcp=True)]
        for client in clients:
            with pytest.raises(EndpointError):
                async with client:
                    raise AssertionError("opened")
            assert client.closed


@pytest.mark.anyio
async def test_ipv6_loopback_works(anyio_backend: str) -> None:
    """Before: IPv6 was never enabled on the sockets, so ``tcp://[::1]:PORT`` failed."""
    async with ZmqRouterClientTransport("tcp://[::1]:0", allow_insecure_tcp=True) as client:
        assert client.address.startswith("tcp://[::1]:")
        engine = ZmqDealerEngineTransport(client.address, 3, allow_insecure_tcp=True)
        engine.open()
        try:
            engine.send_nowait(None, Heartbeat(3, 7))
            with anyio.fail_after(30):
                event = await client.receive()
            assert isinstance(event, Received) and event.peer == 3
            client.send_nowait(3, Request(11, 3, "echo", CODEC.encode_value(None)))
            assert engine.wait_readable(30)
            got = engine.try_receive()
            assert isinstance(got, Received) and isinstance(got.envelope, Request)
            assert got.envelope.id == 11
        finally:
            engine.close()


# -- finding 8: the Pair client uses the same bind check as every other class ------------

@pytest.mark.parametrize("host", ["0.0.0.0", "*", "[::]"])
def test_pair_client_refuses_a_wildcard_tcp_bind_without_curve(host: str) -> None:
    address = f"tcp://{host}:{free_tcp_port()}"
    with pytest.raises(InsecureBind):
        ZmqPairClientTransport([address], context=zmq.Context.instance())
    ZmqPairClientTransport([address], context=zmq.Context.instance(), allow_insecure_tcp=True)


# -- finding 9: ipc paths given by the caller --------------------------------------------

def _binders(address: str) -> list[Callable[[], object]]:
    return [lambda: ZmqRouterEngineTransport(address, 0).open(),
            lambda: ZmqPushPullEngineTransport(address, "inproc://x", 0).open()]


def test_ipc_bind_in_a_world_writable_directory_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp: another user could create or replace the socket
    address = f"ipc://{shared}/engine.sock"
    for bind in _binders(address):
        with pytest.raises(IpcPathUnsafe, match="mode 1777"):
            bind()
    assert not list(shared.iterdir())


@pytest.mark.anyio
async def test_ipc_client_bind_and_dial_in_unsafe_directories_are_refused(
        tmp_path: Path, anyio_backend: str) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(IpcPathUnsafe):
        async with ZmqRouterClientTransport(f"ipc://{shared}/control.sock"):
            pass
    with pytest.raises(IpcPathUnsafe):  # a dialer could reach an impostor's socket
        async with ZmqDealerClientTransport([f"ipc://{shared}/e0.sock"]):
            pass
    engine = ZmqDealerEngineTransport(f"ipc://{shared}/control.sock", 0)
    with pytest.raises(IpcPathUnsafe):
        engine.open()
    # a directory that does not exist yet, under a world-writable one: refused too
    engine = ZmqDealerEngineTransport(f"ipc://{shared}/later/control.sock", 0)
    with pytest.raises(IpcPathUnsafe, match="could create it first"):
        engine.open()


@pytest.mark.parametrize("kind", ["regular file", "symlink", "directory"])
def test_ipc_bind_never_deletes_what_is_not_our_socket(tmp_path: Path, kind: str) -> None:
    """Before: libzmq unlinked a regular file at the path on bind."""
    os.chmod(tmp_path, 0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    path = tmp_path / "engine.sock"
    if kind == "regular file":
        path.write_text("precious")
    elif kind == "symlink":
        path.symlink_to(victim)
    else:
        path.mkdir()
    for bind in _binders(f"ipc://{path}"):
        with pytest.raises(IpcPathUnsafe, match="it would be deleted"):
            bind()
    assert os.path.lexists(path) and victim.read_text() == "precious"
    if kind == "regular file":
        assert path.read_text() == "precious"


def test_stale_socket_of_ours_is_replaced(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    path = tmp_path / "engine.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays behind, like after a crash
    engine = ZmqRouterEngineTransport(f"ipc://{path}", 0)
    engine.open()
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    finally:
        engine.close()
    assert not path.exists()


def test_chmod_after_bind_never_follows_a_link(tmp_path: Path) -> None:
    """Before: ``os.chmod`` after bind followed a symbolic link that another user swapped
    in for the socket (a race won in 23-46 binds chmod'ed a root-owned file). The race
    is reproduced deterministically: the link is already there when the chmod runs."""
    os.chmod(tmp_path, 0o700)
    target = tmp_path / "target"
    target.write_text("x")
    os.chmod(target, 0o644)
    link = tmp_path / "engine.sock"
    link.symlink_to(target)
    secure_ipc_file(f"ipc://{link}")
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644


# -- finding 6: salvaging the id of a malformed frame is bounded -------------------------

def _amplifying_frame(size: int, codec_name: str) -> bytes:
    """A malformed request of ``size`` bytes whose body is one array of empty arrays:
    decoding it in full builds ``size`` Python lists (~60x the frame in memory)."""
    if codec_name == "json":
        head = b'["q",4242,7,'
        n = (size - len(head) - 2) // 3
        return head + b"[" + b"[]," * (n - 1) + b"[]]]"
    head = b"\x93\xa1q\xcd\x10\x92"  # ["q", 4242, <array32>]
    n = size - len(head) - 5
    return head + b"\xdd" + n.to_bytes(4, "big") + b"\x90" * n


@pytest.mark.parametrize("codec_name", ["msgpack", "json"])
def test_salvaging_the_id_of_a_16_mb_malformed_frame_is_bounded(codec_name: str) -> None:
    """Before: ``salvage_id`` decoded the whole frame: a 16 MB frame peaked at 1.2 GB and
    took 6.5 s of CPU. The id is now read from the first bytes; the peak is reported."""
    codec = MsgpackCodec() if codec_name == "msgpack" else JsonCodec()
    size = 16 * 1024 * 1024
    frame = _amplifying_frame(size, codec_name)
    assert abs(len(frame) - size) < 16
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        event = decode_event(codec, frame, 0, None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"\nsalvage[{codec_name}]: 16 MiB malformed frame, traced peak {peak / 2**20:.2f} MiB")
    assert isinstance(event, Dropped) and event.reason == "malformed"
    assert event.request_id == 4242  # still answerable
    assert peak < 3 * len(frame), peak


# -- finding 7 (transport part): what a peer can make libzmq buffer is bounded in bytes ---

def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


FLOODER = """
import sys, zmq
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.setsockopt(zmq.SNDHWM, 0)  # unbounded on the hostile side
s.setsockopt(zmq.LINGER, 0)
s.connect(sys.argv[1])
frame = b"\\x00" * int(sys.argv[2])
for _ in range(int(sys.argv[3])):
    s.send(frame)
print("SENT", flush=True)
sys.stdin.read()  # stay connected until told to go
"""


def test_default_options_bound_buffered_bytes_per_peer() -> None:
    options = ZmqOptions()
    limit = MsgpackCodec().max_message_size
    assert options.effective_rcvhwm(limit) * options.hard_limit(limit) <= options.max_queued_bytes
    assert options.hard_limit(limit) > limit  # a frame just over the limit is answered


def test_flood_of_large_frames_at_a_peer_that_does_not_read_is_bounded(tmp_path: Path) -> None:
    """A peer sends 1 MiB frames without end to an engine that does not read. Before,
    libzmq queued up to RCVHWM (10,000) frames of up to twice the codec's limit per peer:
    here the whole flood (320 MiB). Now at most ``max_queued_bytes``; the peak is printed."""
    os.chmod(tmp_path, 0o700)
    frame_size, frames = 1024 * 1024 - 1024, 320
    codec = MsgpackCodec(max_message_size=1024 * 1024)
    options = ZmqOptions(max_queued_bytes=16 * 1024 * 1024)
    engine = ZmqRouterEngineTransport(f"ipc://{tmp_path}/e.sock", 0, codec=codec,
                                      options=options)
    engine.open()
    flooder = subprocess.Popen([sys.executable, "-c", FLOODER, engine.address,
                                str(frame_size), str(frames)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        base = _rss()
        assert flooder.stdout is not None and flooder.stdout.readline().strip() == "SENT"
        peak = 0
        for _ in range(30):  # let libzmq take in whatever it will
            peak = max(peak, _rss() - base)
            time.sleep(0.1)
        print(f"\nflood: {frames} x {frame_size / 2**20:.2f} MiB at an engine that does not "
              f"read: RSS peak +{peak / 2**20:.1f} MiB (bound {options.max_queued_bytes >> 20}"
              f" MiB + one frame in decoding)")
        assert peak < options.max_queued_bytes + 16 * 1024 * 1024, peak
        # what was queued is still delivered, as counted drops (the frames are not envelopes)
        event = engine.try_receive()
        assert isinstance(event, Dropped) and event.reason == "malformed"
    finally:
        if flooder.stdin is not None:
            flooder.stdin.close()
        flooder.wait(30)
        engine.close()


@pytest.mark.anyio
async def test_push_pull_replies_from_ranks_not_configured_are_dropped_and_counted(
        tmp_path: Path, anyio_backend: str) -> None:
    """A PULL cannot tell who sent a frame: the rank is whatever the envelope claims.
    Before, 1M frames with made-up ranks made 1M peers. Now only configured ranks pass."""
    os.chmod(tmp_path, 0o700)
    transport = ZmqPushPullClientTransport({0: f"ipc://{tmp_path}/r0.sock",
                                            1: f"ipc://{tmp_path}/r1.sock"},
                                           f"ipc://{tmp_path}/replies.sock")
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    hostile = ctx.socket(zmq.PUSH)
    hostile.setsockopt(zmq.SNDHWM, 0)  # queue on the hostile side: never block this loop
    n = 5_000
    try:
        async with ControlClient(transport, ranks=2, default_timeout=5.0) as client:
            hostile.connect(transport.reply_address)
            for i in range(n):
                hostile.send(CODEC.encode(Heartbeat(1000 + i, 1)))
            hostile.send(CODEC.encode(Heartbeat(1, 7)))  # a configured rank still gets in
            with anyio.fail_after(60):
                while (transport.counters["unknown_peer"] < n
                       or client.peers.peers[1].incarnation != 7):
                    await anyio.sleep(0.01)
            assert transport.counters["unknown_peer"] == n
            assert set(client.peers.peers) <= {0, 1}
            print(f"\npush-pull: {n} frames with made-up ranks dropped; peers "
                  f"{sorted(client.peers.peers)}")
    finally:
        hostile.close(linger=0)
        ctx.term()


@pytest.mark.anyio
async def test_every_socket_of_every_transport_has_zmtp_heartbeats_off_and_a_byte_bound(
        tmp_path: Path, anyio_backend: str) -> None:
    """The API server side died the same way as engines (finding 1): the configuration
    that cannot abort is the one shared ``ZmqOptions.apply``, checked on every socket."""
    os.chmod(tmp_path, 0o700)
    budget = ZmqOptions().max_queued_bytes
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()

    def check(sockets: list[zmq.Socket[bytes]]) -> None:
        assert sockets
        for raw in sockets:
            assert raw.getsockopt(zmq.HEARTBEAT_IVL) == 0
            hwm, size = raw.getsockopt(zmq.RCVHWM), raw.getsockopt(zmq.MAXMSGSIZE)
            assert isinstance(hwm, int) and isinstance(size, int)
            assert 0 < hwm * size <= budget

    clients = [ZmqRouterClientTransport(f"ipc://{tmp_path}/c.sock"),
               ZmqDealerClientTransport([f"ipc://{tmp_path}/e.sock"]),
               ZmqPushPullClientTransport([f"ipc://{tmp_path}/q.sock"],
                                          f"ipc://{tmp_path}/p.sock"),
               ZmqPairClientTransport(["inproc://ctlwire-hb-pair"], context=ctx)]
    for client in clients:
        async with client:
            check(client._raw)
    engines = [ZmqDealerEngineTransport(f"ipc://{tmp_path}/c.sock", 0),
               ZmqRouterEngineTransport(f"ipc://{tmp_path}/e.sock", 0),
               ZmqPushPullEngineTransport(f"ipc://{tmp_path}/q.sock",
                                          f"ipc://{tmp_path}/p.sock", 0),
               ZmqPairEngineTransport("inproc://ctlwire-hb-pair", 0, context=ctx)]
    for engine in engines:
        engine.open()
        try:
            check(engine._raw)
        finally:
            engine.close()
    ctx.term()
