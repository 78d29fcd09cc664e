"""Routing ids a peer chooses, against real engine processes that bind a ROUTER:
no peer takes over another's route, and no id a peer claims makes libzmq abort
the engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import zmq
from raw_peer import CODEC, METRICS, NIL, ipc

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.transports.envelope import Reply, Request
from ctlwire.transports.zmq_client import ZmqDealerClientTransport

pytestmark = pytest.mark.timeout(90)


def _unseeded_router_starts(routers: int) -> list[int]:
    """Where the automatic routing ids of the first ``routers`` ROUTERs of a process
    whose C ``rand()`` nobody seeded start (libzmq: ``rand() | rand() << 31``,
    32 bits), computed in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-c",
         "import ctypes; r = ctypes.CDLL(None).rand; "
         f"print(*[r() for _ in range({2 * routers})])"],
        capture_output=True, text=True, check=True).stdout.split()
    values = [int(v) for v in out]
    pairs = zip(values[::2], values[1::2], strict=True)
    return [(low | high << 31) & 0xFFFFFFFF for low, high in pairs]


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _dealer(ctx: zmq.Context[zmq.Socket[bytes]], address: str,
            identity: bytes | None = None) -> zmq.Socket[bytes]:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    sock.connect(address)
    return sock


def _ask_metrics(sock: zmq.Socket[bytes], rid: int, timeout: float) -> Reply | None:
    """Send a ``ctlwire.metrics`` request; its reply, or None if none came."""
    sock.send(CODEC.encode(Request(rid, 0, METRICS, NIL)))
    while sock.poll(int(timeout * 1000)):
        env = CODEC.decode(sock.recv())
        if type(env) is Reply and env.id == rid:
            return env
    return None


@pytest.mark.parametrize("mode", ["poll", "serve"])
def test_claiming_the_ids_libzmq_assigns_next_cannot_abort_the_engine(
        mode: str, tmp_path: Path) -> None:
    """Peers claim the automatic ids an unseeded libzmq would give the next peers
    (the first ROUTERs' counters, 8 ids each), then anonymous peers connect: the
    engine keeps serving every one of them."""
    address = ipc(tmp_path)
    claims = [b"\x00" + ((start + k) & 0xFFFFFFFF).to_bytes(4, "big")
              for start in _unseeded_router_starts(4) for k in range(8)]
    with EngineFleet(1, lambda r: ["--bind", address, "--mode", mode]) as fleet:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        try:
            claimers = [_dealer(ctx, address, identity) for identity in claims]
            for i, sock in enumerate(claimers):  # each claim is the engine's route now
                assert _ask_metrics(sock, i + 1, 20) is not None
            anonymous = []
            for i in range(8):
                anonymous.append(_dealer(ctx, address))
                if _ask_metrics(anonymous[-1], 100 + i, 10) is None:
                    break
            answered = len(anonymous) if fleet.engines[0].alive else 0
            alive = fleet.engines[0].alive
            for sock in claimers + anonymous:
                sock.close(0)
        finally:
            ctx.term()
        output = "\n".join(fleet.engines[0].output)
    assert alive, output
    assert answered == 8


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["poll", "serve"])
async def test_a_peer_naming_itself_after_a_live_route_never_takes_it(
        mode: str, tmp_path: Path, anyio_backend: str) -> None:
    """A peer that knows a client's route exactly and dials the engine under it is
    refused: it is never answered, and the client keeps its route and its replies."""
    address = ipc(tmp_path)
    with EngineFleet(1, lambda r: ["--bind", address, "--mode", mode]):
        transport = ZmqDealerClientTransport([address])
        async with ControlClient(transport, ranks=1) as client:
            assert await client.call("echo", "before", rank=0, timeout=20) == "before"
            route = _route_of(transport)
            ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
            try:
                impostor = _dealer(ctx, address, route)
                stolen = await anyio.to_thread.run_sync(_ask_metrics, impostor, 7, 1.0)
                results = [await client.call("echo", i, rank=0, timeout=10) for i in range(5)]
                impostor.close(0)
            finally:
                ctx.term()
    assert stolen is None
    assert results == list(range(5))


def _route_of(transport: Any) -> bytes:
    """The routing id rank 0's DEALER of ``transport`` dials under."""
    identity: bytes = transport._by_rank[0].socket.getsockopt(zmq.IDENTITY)
    return identity


@pytest.mark.anyio
async def test_a_clients_dealers_name_themselves_with_128_random_bits(
        tmp_path: Path, anyio_backend: str) -> None:
    first = ZmqDealerClientTransport([ipc(tmp_path)])
    second = ZmqDealerClientTransport([f"ipc://{tmp_path}/other.sock"])
    async with first, second:
        routes = [_route_of(first), _route_of(second)]
    assert routes[0] != routes[1]
    for route in routes:
        assert route.startswith(b"client-") and len(route) == len(b"client-") + 32
        int(route[len(b"client-"):], 16)  # hex digits
