"""A ROUTER's messages received by ``recv_routed`` are exactly what ``recv_frames`` gives."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq

from ctlwire.transports.zmq_frames import recv_frames, recv_queued, recv_routed
from ctlwire.transports.zmq_socket import AsyncZmqSocket

pytestmark = pytest.mark.timeout(30)

#: messages a DEALER sends: one part, several, empty parts
MESSAGES = [[b"one"], [b"a", b"b", b"c"], [b""], [b"", b"x", b""], [b"z" * 5000]]


@pytest.fixture
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    dealer = ctx.socket(zmq.DEALER)
    for s in (router, dealer):
        s.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.IDENTITY, b"rank-3")
    address = f"inproc://{request.node.name}"
    router.bind(address)
    dealer.connect(address)
    yield router, dealer
    router.close()
    dealer.close()
    ctx.term()


def _send_all(dealer: zmq.Socket[bytes], router: zmq.Socket[bytes]) -> None:
    for parts in MESSAGES:
        dealer.send_multipart(parts)
    deadline = time.monotonic() + 10  # a hang guard only
    while not router.poll(0) and time.monotonic() < deadline:
        time.sleep(0.001)


def test_recv_routed_gives_recv_frames_parts(
        pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    router, dealer = pair
    _send_all(dealer, router)
    got = [recv_routed(router) for _ in range(len(MESSAGES) - 1)]
    got.append(recv_frames(router))
    assert got == [[b"rank-3", *parts] for parts in MESSAGES]
    assert all(type(p) is bytes for msg in got for p in msg)
    with pytest.raises(zmq.Again):
        recv_routed(router)


def test_a_wrapped_router_receives_every_part_in_order(
        pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    router, dealer = pair
    _send_all(dealer, router)
    sock = AsyncZmqSocket(router)
    first = sock.recv_multipart_nowait()
    rest = sock.recv_many_nowait(64)
    assert [first, *rest] == [[b"rank-3", *parts] for parts in MESSAGES]
    assert sock.recv_many_nowait(64) == []


def test_recv_queued_with_recv_routed_stops_at_its_limit(
        pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    router, dealer = pair
    _send_all(dealer, router)
    out: list[list[bytes]] = []
    recv_queued(router, None, 2, out, recv_routed)
    assert out == [[b"rank-3", *parts] for parts in MESSAGES[:2]]
    recv_queued(router, None, 64, out, recv_routed)
    assert out == [[b"rank-3", *parts] for parts in MESSAGES]
