"""The protocol version exchanged at first contact, both directions, on real sockets.

A peer announcing another major version is refused with a typed error and
counted; a peer announcing a newer minor version (with optional fields this
side does not know) is served. Raw pyzmq sockets play the foreign peer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import zmq

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.engine.endpoint import EngineEndpoint, new_incarnation
from ctlwire.kernel.errors import NotDelivered, UnsupportedProtocolVersion, remote_error
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.envelope import ErrorInfo, Heartbeat, Reply, Request
from ctlwire.transports.error_codes import ErrorCode
from ctlwire.transports.protocol_version import (
    PROTOCOL_VERSION,
    pack_version,
    supported_version,
    version_text,
)
from ctlwire.transports.zmq_client import ZmqDealerClientTransport, ZmqRouterClientTransport
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

CODEC = MsgpackCodec()
MAJOR_2 = pack_version(2, 0)
MINOR_NEWER = pack_version(1, 7)


def heartbeat_frame(rank: int, incarnation: int, version: int, extra: tuple[Any, ...] = ()
                    ) -> bytes:
    """A heartbeat as a peer of ``version`` sends it, with trailing fields this side
    does not know (``extra``)."""
    hb = Heartbeat(rank, incarnation, version=version)
    return msgspec.msgpack.encode(["h", *_fields(hb), *extra])


def _fields(st: msgspec.Struct) -> list[Any]:
    return [getattr(st, f) for f in st.__struct_fields__]


def request_frame(req: Request, extra: tuple[Any, ...] = ()) -> bytes:
    """``req`` encoded with trailing fields appended (a newer minor version's)."""
    data = CODEC.encode(req)
    if not extra:
        return data
    # re-encode the array with more elements: the payload stays pre-encoded bytes
    items: list[Any] = msgspec.msgpack.decode(data)
    return msgspec.msgpack.encode([*items, *extra])


@contextmanager
def foreign_engine(address: str, rank: int, version: int,
                   extra: tuple[Any, ...] = ()) -> Iterator[dict[str, int]]:
    """A raw engine for ``rank`` at the client's ROUTER: a request DEALER (answers
    ``echo`` requests) and a beacon DEALER sending heartbeats of ``version``."""
    stop = threading.Event()
    seen = {"requests": 0}
    incarnation = new_incarnation()

    def run() -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        req = ctx.socket(zmq.DEALER)
        req.setsockopt(zmq.IDENTITY, b"rank-%d" % rank)
        beat = ctx.socket(zmq.DEALER)
        beat.setsockopt(zmq.IDENTITY, b"beat-%d" % rank)
        for s in (req, beat):
            s.setsockopt(zmq.LINGER, 0)
            s.connect(address)
        try:
            while not stop.is_set():
                beat.send(heartbeat_frame(rank, incarnation, version, extra))
                if req.poll(50):
                    env = CODEC.decode(req.recv())
                    if isinstance(env, Request):
                        seen["requests"] += 1
                        req.send(CODEC.encode(Reply(env.id, rank, incarnation, True,
                                                    env.payload)))
        finally:
            req.close(0)
            beat.close(0)
            ctx.term()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(10)


async def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.02)


def test_version_arithmetic() -> None:
    assert PROTOCOL_VERSION == 0x0100
    assert version_text(PROTOCOL_VERSION) == "1.0"
    assert supported_version(MINOR_NEWER) and supported_version(pack_version(1, 255))
    assert not supported_version(MAJOR_2) and not supported_version(0)
    assert not supported_version(-1) and version_text(-1) == "invalid (-1)"
    with pytest.raises(ValueError):
        pack_version(256, 0)


async def test_client_refuses_an_engine_of_another_major_version() -> None:
    transport = ZmqRouterClientTransport()
    async with ControlClient(transport, ranks=[0], default_timeout=20.0) as client:
        with foreign_engine(transport.address, 0, MAJOR_2) as seen:
            await wait_for(lambda: client.metrics()["counters"].get(
                "dropped_protocol_version", 0) >= 2)
            with pytest.raises(UnsupportedProtocolVersion) as info:
                await client.call("echo", "x", rank=0, timeout=10.0)
            assert isinstance(info.value, NotDelivered)  # nothing was sent
            assert "2.0" in str(info.value) and info.value.rank == 0
            assert seen["requests"] == 0


async def test_client_serves_an_engine_of_a_newer_minor_version() -> None:
    transport = ZmqRouterClientTransport()
    async with ControlClient(transport, ranks=[0], default_timeout=20.0) as client:
        with foreign_engine(transport.address, 0, MINOR_NEWER, extra=("a future field", [1])):
            assert await client.call("echo", "x", rank=0, timeout=20.0) == "x"
            assert client.metrics()["counters"].get("dropped_protocol_version", 0) == 0


@contextmanager
def foreign_bound_engine(address: str, rank: int, version: int) -> Iterator[dict[str, int]]:
    """A raw engine that binds a ROUTER at ``address`` and sends heartbeats of ``version``
    in-band to every client route that said hello (no beacon)."""
    stop = threading.Event()
    seen = {"requests": 0, "hellos": 0}
    incarnation = new_incarnation()

    def run() -> None:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(address)
        routes: set[bytes] = set()
        try:
            while not stop.is_set():
                for route in routes:
                    sock.send_multipart([route, heartbeat_frame(rank, incarnation, version)])
                while sock.poll(50):
                    route, data = sock.recv_multipart()
                    env = CODEC.decode(data)
                    routes.add(route)
                    if isinstance(env, Request):
                        seen["requests"] += 1
                    else:
                        seen["hellos"] += 1
        finally:
            sock.close(0)
            ctx.term()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(10)


async def test_dealer_client_refuses_an_engine_of_another_major_version(tmp_path: Path
                                                                        ) -> None:
    """The per-rank clients refuse the same way (here the DEALER client, an engine that
    binds and heartbeats in-band)."""
    directory = tmp_path / "sockets"
    directory.mkdir(mode=0o700)
    address = f"ipc://{directory}/engine"
    with foreign_bound_engine(address, 0, MAJOR_2) as seen:
        transport = ZmqDealerClientTransport({0: address})
        async with ControlClient(transport, ranks=[0], default_timeout=20.0) as client:
            await wait_for(lambda: client.metrics()["counters"].get(
                "dropped_protocol_version", 0) >= 2)
            with pytest.raises(UnsupportedProtocolVersion):
                await client.call("echo", "x", rank=0, timeout=10.0)
        assert seen["requests"] == 0 and seen["hellos"] >= 1


@contextmanager
def raw_router() -> Iterator[tuple[zmq.Socket[bytes], str]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    try:
        yield sock, f"tcp://127.0.0.1:{port}"
    finally:
        sock.close(0)
        ctx.term()


def recv_reply(sock: zmq.Socket[bytes], request_id: int, timeout: float = 20.0) -> Reply:
    """The reply to ``request_id`` that reaches the raw ROUTER (heartbeats skipped)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if sock.poll(100):
            _route, data = sock.recv_multipart()
            env = CODEC.decode(data)
            if isinstance(env, Reply) and env.id == request_id:
                return env
    raise AssertionError(f"no reply to request {request_id}")


def engine_route(sock: zmq.Socket[bytes], timeout: float = 20.0) -> bytes:
    """The request connection's identity of the engine, once its request connection
    takes frames (the ROUTER is mandatory: a send to an absent identity fails)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            sock.send_multipart([b"rank-0", heartbeat_frame(-1, 0, PROTOCOL_VERSION)])
            return b"rank-0"
        except zmq.ZMQError:
            time.sleep(0.05)
    raise AssertionError("the engine never connected")


async def test_engine_refuses_a_client_of_another_major_version() -> None:
    ran: list[str] = []
    with raw_router() as (sock, address):
        transport = ZmqDealerEngineTransport(address, 0, allow_insecure_tcp=True)
        endpoint = EngineEndpoint(transport, rank=0, heartbeat_interval=0.1)

        @endpoint.method()
        def echo(x: str) -> str:
            ran.append(x)
            return x

        async with anyio.create_task_group() as tg:
            await tg.start(endpoint.serve)
            route = await anyio.to_thread.run_sync(engine_route, sock)
            raw = CODEC.encode_value("refused")
            # a heartbeat of another major version is dropped and counted
            sock.send_multipart([route, heartbeat_frame(-1, 0, MAJOR_2)])
            sock.send_multipart([route, CODEC.encode(Request(7, 0, "echo", raw,
                                                             version=MAJOR_2))])
            reply = await anyio.to_thread.run_sync(recv_reply, sock, 7)
            assert not reply.ok and reply.error is not None
            assert reply.error.type == "UnsupportedProtocolVersion"
            assert reply.error.code == ErrorCode.UNSUPPORTED_PROTOCOL_VERSION
            assert "1.0" in reply.error.message and "2.0" in reply.error.message
            # a newer minor version, with a field this engine does not know, runs
            sock.send_multipart([route, request_frame(
                Request(8, 0, "echo", CODEC.encode_value("served"), version=MINOR_NEWER),
                extra=({"future": True},))])
            reply = await anyio.to_thread.run_sync(recv_reply, sock, 8)
            assert reply.ok and CODEC.decode_value(reply.result) == "served"
            metrics = endpoint.metrics()
            tg.cancel_scope.cancel()
    assert ran == ["served"]
    assert metrics["counters"]["protocol_version_refused"] == 2  # the request and the heartbeat


def test_an_engine_refusal_is_the_typed_error() -> None:
    err = remote_error(ErrorInfo("UnsupportedProtocolVersion", "speaks 1.0, request 2.0",
                                 ErrorCode.UNSUPPORTED_PROTOCOL_VERSION), rank=3)
    assert isinstance(err, UnsupportedProtocolVersion) and isinstance(err, NotDelivered)
    assert err.rank == 3
    # the same code under another name is an ordinary remote error
    other = ErrorInfo("Other", "", ErrorCode.UNSUPPORTED_PROTOCOL_VERSION)
    assert not isinstance(remote_error(other), UnsupportedProtocolVersion)
