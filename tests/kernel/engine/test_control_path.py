"""Control never waits behind data: with every lane share and the byte budget of an
engine that binds full of other peers' requests (serve mode, real sockets), a
take-over and an abort are answered at once, never ``Busy``."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import zmq

from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.engine.ledger_messages import TakeOver
from ctlwire.kernel.engine.operation_ledger import (
    ABORT_STEP_METHOD,
    TAKE_OVER_METHOD,
    OperationLedger,
)
from ctlwire.kernel.engine.step_abort import AbortStep
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.envelope import Reply, Request
from ctlwire.transports.zmq_engine import ZmqRouterEngineTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

CODEC = MsgpackCodec()
NIL = CODEC.encode_value(None)
PADDING = 200 * 1024


def padded(rid: int, method: str, payload: msgspec.Raw = NIL) -> bytes:
    """A ``method`` request with ``PADDING`` bytes in a trailing field it ignores."""
    frame = CODEC.encode(Request(rid, 0, method, payload))
    count = frame[0] & 0x0F
    return (bytes([0x90 | (count + 1)]) + frame[1:] + b"\xdb" + struct.pack(">I", PADDING)
            + b"p" * PADDING)


def ask(sock: zmq.Socket[bytes], frame: bytes, rid: int, timeout: float = 10.0) -> Reply:
    sock.send(frame)
    end = time.monotonic() + timeout
    while (left := end - time.monotonic()) > 0:
        if sock.poll(int(left * 1000)):
            env = CODEC.decode(sock.recv())
            if type(env) is Reply and env.id == rid:
                return env
    raise AssertionError(f"no reply to {rid}")


def fill(ctx: zmq.Context[zmq.Socket[bytes]], address: str, peers: list[Any]) -> int:
    """Seven peers (added to ``peers``): one runs ``hang`` (its lane's one worker), the
    others queue padded ``hang`` requests until each is refused ``Busy``. The number
    refused."""
    busy, rid = 0, 1
    for n in range(7):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        peers.append(sock)
        if n == 0:
            sock.send(CODEC.encode(Request(rid, 0, "hang", NIL)))
            rid += 1
            continue
        for _ in range(64):
            sock.send(padded(rid, "hang"))
            rid += 1
        end = time.monotonic() + 10
        while not sock.poll(100) and time.monotonic() < end:
            pass
        while sock.poll(200):
            env = CODEC.decode(sock.recv())
            busy += type(env) is Reply and env.error is not None and env.error.type == "Busy"
    return busy


async def test_a_take_over_and_an_abort_are_never_queued_behind_data(
        anyio_backend: str, tmp_path: Path) -> None:
    """Seven peers fill the engine's lane and its byte budget; a controller's request
    of ``hang`` is refused ``Busy``, its take-over and abort of the same size are
    answered."""
    os.chmod(tmp_path, 0o700)
    address = f"ipc://{tmp_path}/e.sock"
    endpoint = EngineEndpoint(ZmqRouterEngineTransport(address, 0),
                              max_queued_request_bytes=1 << 20)
    OperationLedger({"mark": lambda x=None: x}, threaded=True).install(endpoint)

    @endpoint.method()
    async def hang() -> None:
        await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        await tg.start(endpoint.serve)

        def attack_then_control() -> tuple[int, Reply, Reply, Reply]:
            ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
            peers: list[Any] = []
            try:
                busy = fill(ctx, address, peers)
                controller = ctx.socket(zmq.DEALER)
                controller.setsockopt(zmq.LINGER, 0)
                controller.connect(address)
                peers.append(controller)
                # the same size each: a data request does not fit, control need not
                data = ask(controller, padded(9001, "hang"), 9001)
                fence = int(time.time() * 1e6)
                take = ask(controller, padded(9002, TAKE_OVER_METHOD,
                                              CODEC.encode_value(TakeOver(fence))), 9002)
                abort = ask(controller, padded(9003, ABORT_STEP_METHOD, CODEC.encode_value(
                    AbortStep("op", "step", "apply", fence))), 9003)
                return busy, data, take, abort
            finally:
                for sock in peers:
                    sock.close(0)
                ctx.term()

        busy, data, take, abort = await anyio.to_thread.run_sync(attack_then_control)
        queued = endpoint.metrics()["queued_requests"]
        tg.cancel_scope.cancel()
    print(f"\n{anyio_backend}: {busy} refused Busy; queued {queued}")
    assert busy > 0 and queued["bytes"] > (1 << 20) - PADDING  # the budget is full
    assert data.error is not None and data.error.type == "Busy"  # and refuses data
    assert take.ok, take.error
    assert abort.ok and msgspec.msgpack.decode(abort.result) is False
