"""The fan-out send path: encoded bytes straight to the transport, the request
encoded once as a template for many ranks, the same frames and outcomes as
envelopes through ``send_nowait``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from ctlwire.kernel.client import call_issuer as issuer_module
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.transports.codec import _RANK_MARK as RANK_MARK
from ctlwire.transports.codec import JsonCodec, MsgpackCodec, PickleCodec
from ctlwire.transports.envelope import Envelope, Heartbeat, Request
from ctlwire.transports.zmq_client import ZmqRouterClientTransport
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport

pytestmark = pytest.mark.timeout(60)

CODECS = [MsgpackCodec(), JsonCodec(), PickleCodec(allow_pickle=True)]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_a_spliced_request_equals_its_full_encoding(codec: Any) -> None:
    raw = codec.encode_value({"mode": "drain", "n": [1, 2.5]})
    for template in (Request(9, 0, "pause", raw),
                     Request(2**50, 0, "m" * 300, raw, 1.7e9, 0, 2**61, {"tp": "x"}, "key-1",
                             2**40)):
        splice = codec.request_splicer(template)
        assert splice is not None
        for rank in (0, 1, 15, 255, 256, 70_000, 2**33):
            for seq in (1, 127, 128, 65_536, 2**31):
                expected = codec.encode(msgspec.structs.replace(template, rank=rank, seq=seq))
                assert splice(rank, seq) == expected


def test_no_splice_when_a_mark_occurs_in_the_payload() -> None:
    codec = MsgpackCodec()
    raw = codec.encode_value([RANK_MARK])  # the payload itself holds the rank's mark
    assert codec.request_splicer(Request(1, 0, "m", raw)) is None


class Recording(ZmqRouterClientTransport):
    """Records every request frame the client hands over, by path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.encoded: list[tuple[int, bytes]] = []
        self.envelopes: list[tuple[int, Envelope]] = []

    def send_encoded_nowait(self, rank: int, data: bytes) -> None:
        self.encoded.append((rank, data))
        super().send_encoded_nowait(rank, data)

    def send_nowait(self, rank: int, envelope: Envelope) -> None:
        self.envelopes.append((rank, envelope))
        super().send_nowait(rank, envelope)


@pytest.mark.anyio
@pytest.mark.parametrize("ranks", [3, 17])
async def test_fan_out_hands_encoded_frames_over_in_rank_order(
        tmp_path: Path, ranks: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rank's frame goes through ``send_encoded_nowait`` (no envelope through
    ``send_nowait``), in rank order, and decodes to the request that the envelope
    path would have sent; 17 ranks take the spliced template (cut once per fan-out),
    3 do not."""
    cuts = 0
    codec = MsgpackCodec()
    original = MsgpackCodec.request_splicer

    def counting(self: MsgpackCodec, template: Request) -> Any:
        nonlocal cuts
        cuts += 1
        return original(self, template)

    monkeypatch.setattr(MsgpackCodec, "request_splicer", counting)
    client_t = Recording(f"ipc://{tmp_path}/c.sock", codec=codec)
    async with ControlClient(client_t, ranks=ranks, default_timeout=10.0) as c, \
            anyio.create_task_group() as tg:
        for r in range(ranks):
            ep = EngineEndpoint(ZmqDealerEngineTransport(client_t.address, r))
            ep.register("echo", lambda x=None: x)
            await tg.start(ep.serve)
        await c.wait_ready(timeout=10)
        for n in (1, 2):
            client_t.encoded.clear()
            res = await c.fan_out("echo", {"n": n}, idempotency_key=f"k{n}")
            assert res.results == {r: {"n": n} for r in range(ranks)}
            # the client's own heartbeats go the same way: the requests are the rest
            sent = [(r, codec.decode(data)) for r, data in client_t.encoded]
            assert all(type(s) in (Request, Heartbeat) for _, s in sent)
            assert [r for r, s in sent if type(s) is Request] == list(range(ranks))
            reqs = [s for _, s in sent if type(s) is Request]
            assert [(q.rank, q.seq, q.key) for q in reqs] == [(r, n, f"k{n}")
                                                               for r in range(ranks)]
            assert len({(q.id, q.method, bytes(q.payload), q.deadline) for q in reqs}) == 1
        assert [e for _, e in client_t.envelopes if type(e) is Request] == []
        assert cuts == (2 if ranks >= issuer_module._SPLICE_MIN_RANKS else 0)
        tg.cancel_scope.cancel()
