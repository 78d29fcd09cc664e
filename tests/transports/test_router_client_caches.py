"""The codec's shortcuts agree with the codec; the router client's caches are bounded
and its batched sends deliver (the socket's batched readiness checks are pinned in
``test_zmq_socket.py``).
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import pytest
import zmq

from ctlwire.transports.envelope import ErrorInfo, Reply, Request
from ctlwire.transports.transport import Received

pytestmark = pytest.mark.anyio


class Load(msgspec.Struct):
    weight: float


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
            for i in range(zmq_client._CACHE_LIMIT + 100):
                ev = transport._event([b"beat-%d" % (1000 + i), data])
                assert isinstance(ev, Received) and ev.peer == 1000 + i
            assert len(transport._beacon_rank_of) <= zmq_client._CACHE_LIMIT
            # a cached identity still decodes, and a junk frame from it is still Dropped
            ev = transport._event([b"rank-1", b"\xc1junk"])
            assert not isinstance(ev, Received) and ev.reason == "malformed"  # type: ignore[union-attr]
    finally:
        for raw in engines:
            raw.close(0)
        ctx.term()




async def test_a_beacon_heard_before_keeps_every_verdict() -> None:
    """A beacon identity is parsed once; what its later frames say is judged as the
    first: heartbeats of its rank, anything else dropped, versions checked both ways."""
    from ctlwire.transports.envelope import Heartbeat
    from ctlwire.transports.errors import ProtocolVersionRefused, Unroutable
    from ctlwire.transports.protocol_version import PROTOCOL_VERSION
    from ctlwire.transports.transport import Dropped
    from ctlwire.transports.zmq_client import ZmqRouterClientTransport

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        async with ZmqRouterClientTransport("inproc://beacon-verdicts", context=ctx) as t:
            codec = t.codec
            hb = codec.encode(Heartbeat(3, 7))

            def verdict(data: bytes, identity: bytes = b"beat-3") -> Any:
                return t._event([identity, data])

            for _ in range(3):  # parsed, then from the cache
                ev = verdict(hb)
                assert isinstance(ev, Received) and ev.peer == 3
                assert ev.envelope == Heartbeat(3, 7) and ev.route == b"beat-3"
            request = codec.encode(Request(1, 3, "m", codec.encode_value(None)))
            ev = verdict(request)
            assert isinstance(ev, Dropped) and (ev.reason, ev.peer) == ("wrong_type", 3)
            ev = verdict(b"\xc1junk")
            assert isinstance(ev, Dropped) and ev.reason == "malformed"
            newer_minor = codec.encode(Heartbeat(3, 7, version=PROTOCOL_VERSION + 1))
            assert isinstance(verdict(newer_minor), Received)
            ev = verdict(codec.encode(Heartbeat(3, 7, version=PROTOCOL_VERSION + 0x100)))
            assert isinstance(ev, Dropped) and (ev.reason, ev.peer) == ("protocol_version", 3)
            with pytest.raises(ProtocolVersionRefused):
                t.send_nowait(3, Heartbeat(-1, 1))
            assert isinstance(verdict(hb), Received)  # a supported version lifts the refusal
            with pytest.raises(Unroutable) as info:
                t.send_nowait(3, Heartbeat(-1, 1))
            assert not isinstance(info.value, ProtocolVersionRefused)  # no engine: unroutable
            ev = verdict(hb, b"beat-3x")
            assert isinstance(ev, Dropped) and ev.reason == "unknown_peer"
    finally:
        ctx.term()
