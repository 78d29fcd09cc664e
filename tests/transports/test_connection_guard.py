"""Connections a peer opens to a listening socket are bounded, with counted
refusals: peers that connect and say nothing cannot exhaust an engine's
descriptors or keep a talking client out. Real sockets and real processes;
counts are asserted, never durations."""

from __future__ import annotations

import inspect
import os
import resource
import select
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import zmq

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.testing import free_tcp_port
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.connection_guard import ConnectionGuard
from ctlwire.transports.envelope import Heartbeat
from ctlwire.transports.zmq_client import ZmqDealerClientTransport
from ctlwire.transports.zmq_engine import ZmqRouterEngineTransport

pytestmark = [pytest.mark.timeout(180)]

CODEC = MsgpackCodec()
LIMIT = inspect.signature(ZmqRouterEngineTransport).parameters["max_connections"].default


def _until(check: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def _silent(port: int, n: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]


def _ended(socks: list[socket.socket], wait: float = 1.0) -> list[bool]:
    """Which of ``socks`` the peer closed within ``wait`` seconds, watched together
    (what each was sent is read and discarded); each open one was watched ``wait`` s."""
    ended = [False] * len(socks)
    open_ = {s.fileno(): i for i, s in enumerate(socks)}
    deadline = time.monotonic() + wait
    while open_ and (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select(list(open_), [], [], left)
        for fd in readable:
            i = open_[fd]
            try:
                gone = not socks[i].recv(4096, socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except (ConnectionResetError, BrokenPipeError):
                gone = True
            if gone:
                ended[i] = True
                del open_[fd]
    return ended


def _talker(ctx: zmq.Context[Any], address: str, identity: bytes) -> zmq.Socket[bytes]:
    s: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.IDENTITY, identity)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(address)
    return s


def _heard(transport: ZmqRouterEngineTransport, count: int) -> int:
    got = 0
    while got < count and transport.wait_readable(10):
        while transport.try_receive() is not None:
            got += 1
    return got


def test_connections_past_the_bound_are_refused_newest_first_and_counted() -> None:
    """A ROUTER bounded at 4 connections: a client that talks, then 10 silent
    tcp connections: 7 of them are refused (counted), the talker is not and is
    still heard; after the grace, a new talker takes a silent one's place."""
    port = free_tcp_port()
    transport = ZmqRouterEngineTransport(f"tcp://127.0.0.1:{port}", 0, max_connections=4,
                                         allow_insecure_tcp=True, beacon_address="inproc://b")
    transport.open()
    ctx: zmq.Context[Any] = zmq.Context()
    silent: list[socket.socket] = []
    try:
        first = _talker(ctx, transport.address, b"first")
        first.send(CODEC.encode(Heartbeat(-1, 1, 1)))
        assert _heard(transport, 1) == 1
        silent = _silent(port, 10)
        assert _until(lambda: transport.connections_refused >= 7)
        # the refused ones see their connection end (after libzmq's greeting): 7 of 10
        ended = sum(_ended(silent))
        print(f"\nrefused {transport.connections_refused}, open {transport.open_connections}, "
              f"silent ones ended {ended}")
        assert transport.connections_refused == 7 and ended == 7
        assert transport.open_connections == 4
        first.send(CODEC.encode(Heartbeat(-1, 1, 2)))
        assert _heard(transport, 1) == 1  # the talker was never refused
        time.sleep(1.2)  # past the guard's grace: the 3 left are silent, and old
        second = _talker(ctx, transport.address, b"second")
        second.send(CODEC.encode(Heartbeat(-1, 2, 1)))
        assert _heard(transport, 1) == 1
        assert _until(lambda: transport.connections_refused == 8)
        assert transport.open_connections == 4
        for s in (first, second):
            s.close(0)
    finally:
        for s in silent:
            s.close()
        transport.close()
        ctx.term()


def test_the_guard_never_shuts_down_a_descriptor_that_is_not_the_listeners(
        tmp_path: Path) -> None:
    """A descriptor of the process that is not a connection of the listener (a
    file; a socket bound elsewhere) is never shut down, whatever the guard was
    told."""
    from ctlwire.transports import connection_guard as cg

    with open(tmp_path / "f", "w") as f:
        assert not cg._shut_down(f.fileno(), "tcp://127.0.0.1:1")
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen()
    peer = socket.create_connection(other.getsockname())
    conn, _ = other.accept()
    try:
        port = other.getsockname()[1]
        assert not cg._shut_down(conn.fileno(), f"tcp://127.0.0.1:{port + 1}")
        assert not cg._shut_down(other.fileno(), f"tcp://127.0.0.1:{port}")  # the listener
        peer.sendall(b"x")
        assert conn.recv(1) == b"x"  # untouched
        assert cg._shut_down(conn.fileno(), f"tcp://127.0.0.1:{port}")
        assert peer.recv(1) == b""
    finally:
        for s in (peer, conn, other):
            s.close()
    with pytest.raises(ValueError):
        ConnectionGuard(zmq.Context.instance().socket(zmq.ROUTER), 0)


def _client_transport(address: str) -> ZmqDealerClientTransport:
    kwargs: dict[str, Any] = {}
    if "allow_insecure_tcp" in inspect.signature(ZmqDealerClientTransport).parameters:
        kwargs["allow_insecure_tcp"] = True
    return ZmqDealerClientTransport([address], **kwargs)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["poll", "serve"])
async def test_1100_silent_connections_leave_an_engine_with_1024_descriptors_serving(
        mode: str, tmp_path: Path) -> None:
    """An engine process limited to 1,024 descriptors binds loopback tcp; 1,100
    tcp connections that never send a byte arrive. The engine keeps its
    descriptors under its bound, counts the refusals in its metrics, and both a
    client connected before the flood and one that connects after it are
    served. Before, the flood took every descriptor: libzmq's accept failed in a
    loop and a new client got ``NotDelivered``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1400:
        if hard != resource.RLIM_INFINITY and hard < 1400:
            pytest.skip("this process cannot open 1,100 connections")
        resource.setrlimit(resource.RLIMIT_NOFILE, (1400, hard))
    wrapper = tmp_path / "python-1024"
    wrapper.write_text(f'#!/bin/sh\nulimit -n 1024\nexec {os.sys.executable} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    port = free_tcp_port()
    address = f"tcp://127.0.0.1:{port}"
    silent: list[socket.socket] = []
    with EngineFleet(1, lambda r: ["--bind", address, "--allow-insecure-tcp", "--mode", mode],
                     python=str(wrapper)) as fleet:
        pid = fleet.pids()[0]
        try:
            async with ControlClient(_client_transport(address), ranks=1) as before:
                assert await before.call("echo", "warm", rank=0, timeout=20) == "warm"
                silent = await anyio.to_thread.run_sync(_silent, port, 1100)

                async def refused() -> int:
                    m = await before.call("metrics", rank=0, timeout=20)
                    return int(m.get("connections", {}).get("refused", 0))

                with anyio.move_on_after(5):  # the flood settles (asserted below)
                    while await refused() < 1100 - LIMIT:
                        await anyio.sleep(0.1)
                fds = len(os.listdir(f"/proc/{pid}/fd"))
                assert await before.call("echo", "during", rank=0, timeout=20) == "during"
                await anyio.sleep(1.2)  # the silent ones are past the guard's grace
                async with ControlClient(_client_transport(address), ranks=1) as after:
                    assert await after.call("echo", "new", rank=0, timeout=8) == "new"
                metrics = await before.call("metrics", rank=0, timeout=20)
        finally:
            for s in silent:
                s.close()
    print(f"\n{mode}: engine descriptors {fds}; connections {metrics['connections']}")
    assert fds < LIMIT + 64
    assert metrics["connections"]["refused"] >= 1100 - LIMIT + 1
    assert metrics["connections"]["open"] <= LIMIT


@pytest.mark.anyio
async def test_a_client_router_bounds_its_connections_and_keeps_serving_its_engine() -> None:
    """The API server's ROUTER bounded at 4 connections: its engine holds two
    (requests, beacon); of 10 silent tcp connections 8 are refused and counted,
    and the engine's calls are still served."""
    from ctlwire.transports.zmq_client import ZmqRouterClientTransport

    port = free_tcp_port()
    transport = ZmqRouterClientTransport(f"tcp://127.0.0.1:{port}", max_connections=4,
                                         allow_insecure_tcp=True)
    silent: list[socket.socket] = []
    async with ControlClient(transport, ranks=1) as client:
        with EngineFleet(1, lambda r: ["--connect", transport.address,
                                      "--allow-insecure-tcp"]):
            await client.wait_ready(timeout=30)
            assert await client.call("echo", 1, rank=0, timeout=20) == 1
            try:
                silent = await anyio.to_thread.run_sync(_silent, port, 10)
                with anyio.fail_after(30):
                    while transport.connections_refused < 8:
                        await anyio.sleep(0.05)
                assert await client.call("echo", 2, rank=0, timeout=20) == 2
            finally:
                for s in silent:
                    s.close()
    print(f"\nclient ROUTER: refused {transport.connections_refused}")
    assert transport.connections_refused == 8


def test_an_ipc_listener_refuses_the_newest_past_its_bound(tmp_path: Path) -> None:
    """ipc connections (no ``TCP_INFO``): the newest past the bound are refused."""
    os.chmod(tmp_path, 0o700)
    transport = ZmqRouterEngineTransport(f"ipc://{tmp_path}/e.sock", 0, max_connections=2)
    transport.open()
    conns: list[socket.socket] = []
    try:
        for _ in range(5):
            c = socket.socket(socket.AF_UNIX)
            c.connect(f"{tmp_path}/e.sock")
            conns.append(c)
        assert _until(lambda: transport.connections_refused >= 3)
        ended = _ended(conns)
        print(f"\nipc: refused {transport.connections_refused}, ended {ended}")
        assert transport.connections_refused == 3
        assert ended == [False, False, True, True, True]
    finally:
        for c in conns:
            c.close()
        transport.close()


def test_the_liveness_beacon_of_an_engine_that_binds_is_bounded_too() -> None:
    """The beacon's PUB binds next to the ROUTER: connections past the bound are
    refused there too, and counted with the ROUTER's."""
    from ctlwire.transports.envelope import Heartbeat as Beat

    port = free_tcp_port()
    transport = ZmqRouterEngineTransport(f"tcp://127.0.0.1:{port}", 0, max_connections=3,
                                         allow_insecure_tcp=True)
    transport.open()
    silent: list[socket.socket] = []
    try:
        assert transport.start_beacon(0.05, lambda: Beat(0, 1, 1))
        assert transport.beacon_address == f"tcp://127.0.0.1:{port + 1}"
        silent = _silent(port + 1, 8)
        assert _until(lambda: transport.connections_refused >= 5)
        print(f"\nbeacon: refused {transport.connections_refused}")
        assert transport.connections_refused == 5
        assert sum(_ended(silent)) == 5
    finally:
        for s in silent:
            s.close()
        transport.close()
