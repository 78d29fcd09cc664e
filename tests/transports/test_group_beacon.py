"""A group beacon: one message a beat carrying the heartbeats of several ranks of one
process. The client believes each heartbeat only for a rank the beacon's identity
speaks for (and, with ranks bound to keys, that the sender's key is bound to);
anything else is dropped and counted, the rest of the message still delivered.

Raw pyzmq DEALERs play the beacon against the real ROUTER client transport.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest
import zmq

from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.curve import (
    CurveClientConfig,
    CurveServerConfig,
    load_keypair,
    write_keypair,
)
from ctlwire.transports.envelope import Heartbeat, Request
from ctlwire.transports.errors import Unroutable
from ctlwire.transports.group_beacon import (
    MAX_BEACON_GROUP,
    group_beacon_identity,
    ranks_of_group_beacon,
)
from ctlwire.transports.transport import Dropped, Received, TransportEvent
from ctlwire.transports.zmq_client import ZmqRouterClientTransport
from ctlwire.transports.zmq_config import new_identity_tag, rank_identity

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

CODEC = MsgpackCodec()


def test_group_beacon_identities_name_their_ranks_and_nothing_else_does() -> None:
    tag = new_identity_tag()
    assert group_beacon_identity(64, 3) == b"beats-64-3"
    assert ranks_of_group_beacon(group_beacon_identity(64, 3)) == (range(64, 67), b"")
    assert ranks_of_group_beacon(group_beacon_identity(0, 1, tag)) == (range(0, 1), b"." + tag)
    assert ranks_of_group_beacon(group_beacon_identity(5, MAX_BEACON_GROUP)) is not None
    for bad in (b"beats-064-3", b"beats-64-03", b"beats-64-0", b"beats-64",
                b"beats--1-3", b"beats-1-%d" % (MAX_BEACON_GROUP + 1), b"beats-1-3.",
                b"beats-1-3.XY", b"beats-1-3.ab.cd", b"beat-1-3", b"beats-1-3\x00",
                b"beats-1234567890-3"):
        assert ranks_of_group_beacon(bad) is None, bad
    for first, count in ((-1, 3), (0, 0), (0, MAX_BEACON_GROUP + 1)):
        with pytest.raises(ValueError):
            group_beacon_identity(first, count)


@contextmanager
def dealer(address: str, identity: bytes, curve: CurveClientConfig | None = None
           ) -> Iterator[zmq.Socket[bytes]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        curve.apply(sock)
    sock.connect(address)
    try:
        yield sock
    finally:
        sock.close(0)
        ctx.term()


async def take(transport: ZmqRouterClientTransport, n: int) -> list[TransportEvent]:
    """The next ``n`` events (the router client's own heartbeats are never received)."""
    events: list[TransportEvent] = []
    with anyio.fail_after(10):
        while len(events) < n:
            events.extend(await transport.receive_many(n - len(events)))
    return events


def beat(rank: int, seq: int = 1) -> bytes:
    return CODEC.encode(Heartbeat(rank, 7, seq))


async def test_one_message_gives_each_ranks_heartbeat_in_order(anyio_backend: str) -> None:
    async with ZmqRouterClientTransport() as transport:
        with dealer(transport.address, group_beacon_identity(4, 3)) as sock:
            sock.send_multipart([beat(4), beat(5), beat(6)])
            events = await take(transport, 3)
            assert [(type(e), e.peer) for e in events] == [(Received, 4), (Received, 5),
                                                           (Received, 6)]
            assert all(type(e) is Received and e.envelope == Heartbeat(e.peer, 7, 1)
                       for e in events)
            # a group of fewer ranks than it speaks for (a rank paused its heartbeats)
            sock.send_multipart([beat(5, 2)])
            [one] = await take(transport, 1)
            assert type(one) is Received and one.peer == 5 and one.envelope.seq == 2


async def test_what_a_group_beacon_may_not_say_is_dropped_and_counted(
        anyio_backend: str) -> None:
    """A heartbeat for a rank outside the identity's range (a peer lying about who it
    is), a frame that is not a heartbeat, a malformed frame: each dropped and counted,
    the heartbeats beside them delivered. More frames than ranks: the whole message."""
    async with ZmqRouterClientTransport() as transport:
        with dealer(transport.address, group_beacon_identity(4, 3)) as sock:
            sock.send_multipart([beat(3), beat(4), CODEC.encode(Request(1, 5, "m", b""))])
            events = await take(transport, 3)
            assert [type(e) for e in events] == [Dropped, Received, Dropped]
            assert isinstance(events[0], Dropped) and events[0].reason == "impersonation"
            assert isinstance(events[2], Dropped) and events[2].reason == "wrong_type"
            assert transport.counters["impersonation"] == 1
            sock.send_multipart([b"\xc1junk", beat(5)])
            bad, good = await take(transport, 2)
            assert isinstance(bad, Dropped) and bad.reason == "malformed"
            assert type(good) is Received and good.peer == 5
            sock.send_multipart([beat(4), beat(5), beat(6), beat(6)])
            [whole] = await take(transport, 1)
            assert isinstance(whole, Dropped) and whole.reason == "framing"
        with dealer(transport.address, b"beats-4-02") as sock:  # not a group identity
            sock.send_multipart([beat(4), beat(5)])
            [unknown] = await take(transport, 1)
            assert isinstance(unknown, Dropped) and unknown.reason == "unknown_peer"


async def test_under_curve_a_group_speaks_only_for_the_ranks_its_key_is_bound_to(
        anyio_backend: str, tmp_path: Path) -> None:
    """Ranks 0 and 1 bound to one process's key, rank 2 to another: a group beacon
    with the first key claiming ranks 0-2 is believed for 0 and 1 only, and rank 0's
    requests are routed to the tagged request identity the group names."""
    keys = tmp_path / "keys"
    for name in ("server", "proc", "other"):
        write_keypair(keys, name)
    server = load_keypair(keys / "server.key_secret")
    proc, other = (load_keypair(keys / f"{n}.key_secret") for n in ("proc", "other"))
    curve = CurveServerConfig.allowing(server, ranks={0: proc.public, 1: proc.public,
                                                      2: other.public})
    tag = new_identity_tag()
    async with ZmqRouterClientTransport("tcp://127.0.0.1:0", curve=curve) as transport:
        with dealer(transport.address, group_beacon_identity(0, 3, tag),
                    CurveClientConfig(proc, server.public)) as sock, \
                dealer(transport.address, rank_identity(0, tag),
                       CurveClientConfig(proc, server.public)) as requests:
            sock.send_multipart([beat(0), beat(1), beat(2)])
            events = await take(transport, 3)
            assert [type(e) for e in events] == [Received, Received, Dropped]
            assert isinstance(events[2], Dropped) and events[2].reason == "impersonation"
            with anyio.fail_after(10):
                while not requests.poll(0):
                    with contextlib.suppress(Unroutable):  # until its connection is up
                        transport.send_nowait(0, Request(1, 0, "m", b""))
                    await anyio.sleep(0.05)
            assert isinstance(CODEC.decode(requests.recv()), Request)
