"""The sockets' batched readiness checks and the codec's shortcuts: a burst of
sends while a receiver waits re-reads ``EVENTS`` once, not once per send, and the
receiver is never stranded; the router client's caches are bounded.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import pytest
import zmq

from ctlwire.transports.envelope import ErrorInfo, Reply, Request
from ctlwire.transports.transport import Received
from ctlwire.transports.zmq_socket import AsyncZmqSocket

pytestmark = pytest.mark.anyio


class Load(msgspec.Struct):
    weight: float
# -- batched readiness checks -------------------------------------------------------


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes], zmq.Context[Any]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    dealer = ctx.socket(zmq.DEALER)
    router.bind("inproc://fast-path")
    dealer.connect("inproc://fast-path")
    yield router, dealer, ctx
    router.close(0)
    dealer.close(0)
    ctx.term()


def _count_events(sock: AsyncZmqSocket) -> list[int]:
    calls: list[int] = []
    get = sock._get

    def counting(option: int) -> int:
        if option == zmq.EVENTS:
            calls.append(1)
        return get(option)

    sock._get = counting
    return calls


@pytest.mark.parametrize("batched", [True, False])
async def test_burst_of_sends_checks_readiness_once_and_strands_no_receiver(
        pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes], Any], batched: bool,
        anyio_backend: str) -> None:
    peer, raw_dealer, _ctx = pair
    dealer = AsyncZmqSocket(raw_dealer)
    dealer.send_multipart_nowait([b"hello"])
    assert peer.poll(5000)
    ident, _ = peer.recv_multipart()
    got: list[list[bytes]] = []

    async def receive() -> None:
        got.append(await dealer.recv_multipart())

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(receive)
            await anyio.wait_all_tasks_blocked()  # the receiver waits on the fd
            peer.send_multipart([ident, b"reply"])
            assert peer.poll(0) == 0
            threading.Event().wait(0.01)  # let libzmq's send process commands (drain the fd)
            calls = _count_events(dealer)
            if batched:
                with dealer.batched_sends():
                    for i in range(16):
                        dealer.send_multipart_nowait([b"%d" % i])
                    assert calls == []  # nothing re-read inside the block
                assert len(calls) == 1
            else:
                for i in range(16):
                    dealer.send_multipart_nowait([b"%d" % i])
                # asyncio defers the one check to before the loop waits; trio checks
                # now, finds the reply and wakes the receiver (no further checks)
                assert len(calls) == (1 if anyio_backend == "trio" else 0)
    assert got == [[b"reply"]]
    for i in range(16):
        assert peer.poll(5000)
        assert peer.recv_multipart() == [ident, b"%d" % i]


def test_codec_shortcuts_agree_with_the_codec() -> None:
    from ctlwire.transports.codec import JsonCodec, MsgpackCodec, PickleCodec

    for codec in (MsgpackCodec(), JsonCodec()):
        pair_ = codec.fast_value_codec(Load)
        assert pair_ is not None
        encode, decode = pair_
        raw = codec.encode_value(Load(2.5))
        assert encode(Load(2.5)) == bytes(raw)
        assert decode(raw) == codec.decode_value(raw, Load)
        dec = codec.fast_envelope_decoder()
        assert dec is not None
        env = Request(1, 0, "m", raw)
        assert dec(codec.encode(env)) == codec.decode(codec.encode(env))
    pickled = PickleCodec(allow_pickle=True)
    assert pickled.fast_value_codec(Load) is None  # payloads pickled: no shortcut
    assert pickled.fast_envelope_decoder() is not None
    reply = Reply(3, 0, 7, False, MsgpackCodec().encode_value(None), ErrorInfo("E", "m", 1))
    for codec in (MsgpackCodec(), JsonCodec(), pickled):
        enc = codec.fast_envelope_encoder()
        assert enc is not None
        for env in (Request(1, 0, "m", codec.encode_value(Load(2.5)), 5.0, key="k"), reply):
            assert enc(env) == codec.encode(env)

    class Framed(MsgpackCodec):  # a codec whose envelope encoding differs: no shortcut
        def encode(self, envelope: Any) -> bytes:
            return b"!" + super().encode(envelope)

    assert Framed().fast_envelope_encoder() is None



async def test_router_client_caches_are_bounded_and_batched_sends_deliver() -> None:
    from ctlwire.transports import zmq_client
    from ctlwire.transports.envelope import Heartbeat
    from ctlwire.transports.zmq_client import ZmqRouterClientTransport

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    transport = ZmqRouterClientTransport("inproc://fast-client", context=ctx)
    engines = []
    try:
        async with transport:
            for rank in range(3):
                raw = ctx.socket(zmq.DEALER)
                raw.setsockopt(zmq.IDENTITY, b"rank-%d" % rank)
                raw.connect("inproc://fast-client")
                raw.send(transport.codec.encode(Heartbeat(rank, 1)))
                engines.append(raw)
            seen = set()
            with anyio.fail_after(10):
                while len(seen) < 3:
                    ev = await transport.receive()
                    assert isinstance(ev, Received)
                    seen.add(ev.peer)
            codec = transport.codec
            with transport.batched_sends():
                for rank in range(3):
                    transport.send_nowait(rank, Request(rank + 1, rank, "m",
                                                        codec.encode_value(None)))
            for rank, raw in enumerate(engines):
                assert raw.poll(5000)
                env = codec.decode(raw.recv())
                assert isinstance(env, Request) and env.id == rank + 1
            # a peer choosing many identities cannot grow the caches without bound
            data = codec.encode(Heartbeat(0, 1))
            for i in range(zmq_client._CACHE_LIMIT + 100):
                ev = transport._event([b"rank-%d" % (1000 + i), data])
                assert isinstance(ev, Received) and ev.peer == 1000 + i
            assert len(transport._rank_of) <= zmq_client._CACHE_LIMIT
            # a cached identity still decodes, and a junk frame from it is still Dropped
            ev = transport._event([b"rank-1", b"\xc1junk"])
            assert not isinstance(ev, Received) and ev.reason == "malformed"  # type: ignore[union-attr]
    finally:
        for raw in engines:
            raw.close(0)
        ctx.term()


async def test_client_transport_checkpoint_is_a_cancellation_point() -> None:
    from ctlwire.transports.zmq_client import ZmqRouterClientTransport

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        async with ZmqRouterClientTransport("inproc://fast-checkpoint", context=ctx) as t:
            assert t._checkpoint is not anyio.lowlevel.checkpoint  # the backend's own
            with anyio.CancelScope() as scope:
                scope.cancel()
                await t._checkpoint()
                raise AssertionError("the checkpoint did not deliver the cancellation")
            assert scope.cancelled_caught
    finally:
        ctx.term()
