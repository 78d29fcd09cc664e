"""Hostile peers (issue 11), transport level: whatever a process that can reach a socket
sends, it must not abort a ctlwire process, make it run code, hang it, or grow its memory
without bound.

Real engine processes and raw pyzmq sockets play the hostile peer where the finding is
about processes and sockets.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from ctlwire.kernel.engine_fleet import EngineFleet
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.envelope import Reply, Request

pytestmark = [pytest.mark.timeout(180)]

CODEC = MsgpackCodec()


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def request(rid: int, method: str, value: object) -> bytes:
    return CODEC.encode(Request(rid, 0, method, CODEC.encode_value(value)))


def address_for(proto: str, tmp_path: Path) -> str:
    if proto == "ipc":
        os.chmod(tmp_path, 0o700)
        return f"ipc://{tmp_path}/engine.sock"
    return f"tcp://127.0.0.1:{free_tcp_port()}"


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
    if orientation == "engine_binds":
        args = ["--bind", address, "--mode", mode]
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
            fresh.bind(address)
            while not fresh.poll(100):
                assert engine.alive, f"engine exited with {engine.proc.returncode}"
            fresh.recv_multipart()
            fresh.send_multipart([b"rank-0", request(10**9, "echo", "still here")])
        reply = await_reply(fresh, 10**9, timeout=90.0)
        assert reply.ok and CODEC.decode_value(reply.result) == "still here"
        assert engine.alive, f"engine exited with {engine.proc.returncode}"
        fresh.close(linger=0)
    assert engine.proc.returncode == 0  # a clean exit on SIGTERM, not SIGABRT (-6)
