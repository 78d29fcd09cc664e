"""The client's batched sends and reply path keep the general path's behaviour.

Each test fails if its mechanism breaks: ranks planned at once
(``RequestRegistry.plan_sends``), the fan-out's sends inside the transport's
``batched_sends()``, the one-lookup reply path of the peer table and the
cached result decoder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from ctlwire.kernel.client.call_outcome import CallOutcomes
from ctlwire.kernel.core import request_registry as registry_module
from ctlwire.kernel.core.fan_out_policy import Policy
from ctlwire.kernel.core.peer_table import PeerTable, Progress
from ctlwire.kernel.core.request_registry import PendingRequest, RequestRegistry
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.errors import NotDelivered, OutcomeUnknown
from ctlwire.states import PeerState, RequestEvent, RequestState
from ctlwire.testing import EngineHarness, TransitionRecorder
from ctlwire.transports.codec import JsonCodec, MsgpackCodec, PayloadTypeError
from ctlwire.transports.envelope import Envelope
from ctlwire.transports.transport import ClientTransport, TransportEvent


def echo_methods(ep: EngineEndpoint) -> None:
    @ep.method()
    def echo(x: Any = None) -> Any:
        return x


# -- ranks planned at once -------------------------------------------------------------
def test_planning_marks_the_request_sent_in_one_transition() -> None:
    rec = TransitionRecorder()
    reg = RequestRegistry(observer=rec)
    entry = reg.register("m", (0, 1, 2, 3))
    assert reg.plan_sends(entry) == [0, 1, 2, 3]
    assert entry.sent_ranks == [] and entry.state is RequestState.SENT
    assert rec.events[entry.id] == [RequestEvent.SEND]
    assert reg.plan_sends(entry) == []  # nothing twice
    reg.release(entry)


def test_planning_fails_lost_ranks() -> None:
    reg = RequestRegistry()
    entry = reg.register("m", (0, 1, 2))
    assert reg.plan_sends(entry, lambda r: r == 1) == [0, 2]
    assert type(entry.errors[1]) is NotDelivered and entry.state is RequestState.SENT
    reg.release(entry)
    # a lost rank that decides the request (quorum of 2 can no longer be met) stops it
    entry = reg.register("m", (0, 1), Policy.QUORUM)
    assert reg.plan_sends(entry, lambda r: r == 1) == []
    assert not entry.is_open  # nothing to hand over for a decided request
    reg.release(entry)
    # every rank lost: failed, never Sent
    entry = reg.register("m", (0, 1))
    assert reg.plan_sends(entry, lambda r: True) == [] and entry.state is RequestState.FAILED
    reg.release(entry)


def test_a_rank_counts_as_sent_once_its_frame_is_handed_over() -> None:
    reg = RequestRegistry()
    entry = reg.register("m", (0, 1, 2))
    reg.plan_sends(entry)
    reg.sent(entry, 0)  # rank 1's frame waits for room, rank 2's behind it
    decided = reg.fail_rank(1, lambda r: OutcomeUnknown(r, "lost"),
                            lambda r: NotDelivered(r, "lost (not sent)"))
    assert decided == [] and type(entry.errors[1]) is NotDelivered
    reg.sent(entry, 2)
    reg.fail_rank(2, lambda r: OutcomeUnknown(r, "lost"),
                  lambda r: NotDelivered(r, "lost (not sent)"))
    assert type(entry.errors[2]) is OutcomeUnknown
    assert reg.fail_rank(0, lambda r: OutcomeUnknown(r, "lost"),
                         lambda r: NotDelivered(r, "lost (not sent)")) == [entry]
    assert type(entry.errors[0]) is OutcomeUnknown and entry.state is RequestState.FAILED
    reg.release(entry)


class Batching(ClientTransport):
    """A client transport wrapper with ``batched_sends()`` that records, per send,
    whether it was made inside a batch."""

    def __init__(self, inner: ClientTransport) -> None:
        self.inner = inner
        self.batches = 0
        self._depth = 0
        self.sends: list[tuple[int, bool]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def __aenter__(self) -> Batching:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.inner.__aexit__(*exc)

    @contextlib.contextmanager
    def batched_sends(self) -> Iterator[None]:
        self.batches += 1
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    def send_nowait(self, rank: int, envelope: Envelope) -> None:
        if type(envelope).__name__ == "Request":
            self.sends.append((rank, self._depth > 0))
        self.inner.send_nowait(rank, envelope)

    async def send(self, rank: int, envelope: Envelope) -> None:
        await self.inner.send(rank, envelope)

    async def receive(self) -> TransportEvent:
        return await self.inner.receive()

    async def receive_many(self, limit: int = 64) -> list[TransportEvent]:
        return await self.inner.receive_many(limit)


@pytest.mark.anyio
async def test_a_fan_out_sends_in_one_batch_and_plans_ranks_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    plans = 0
    original = RequestRegistry.plan_sends

    def counting(self: RequestRegistry, entry: PendingRequest, is_lost: Any = None
                 ) -> list[int]:
        nonlocal plans
        plans += 1
        return original(self, entry, is_lost)

    monkeypatch.setattr(registry_module.RequestRegistry, "plan_sends", counting)
    wrappers: list[Batching] = []

    def wrap(t: ClientTransport) -> ClientTransport:
        wrappers.append(Batching(t))
        return wrappers[-1]  # type: ignore[return-value]

    async with EngineHarness(ranks=8, setup=echo_methods, wrap_client=wrap) as h:
        await h.client.wait_ready(timeout=10)
        res = await h.client.fan_out("echo", 5)
        assert res.results == {r: 5 for r in range(8)}
        (t,) = wrappers
        assert t.batches == 1 and t.sends == [(r, True) for r in range(8)]
        assert plans == 1  # every rank planned at once
        t.sends.clear()
        assert await h.client.call("echo", 1, rank=3) == 1
        assert t.batches == 1 and t.sends == [(3, False)]  # one rank: no batch needed


# -- the reply path -----------------------------------------------------------------------
def test_reply_seen_is_the_general_path_in_the_common_case() -> None:
    fast, slow = PeerTable([0, 1]), PeerTable([0, 1])
    for t in (fast, slow):
        t.seen(0, 7, now=0.0)
        t.seen(1, 7, now=0.0, progress=Progress(5, "m", 1.0))  # Busy
        t.peers[0].misses = 1
    assert fast.reply_seen(0, 7, now=1.0) is True
    assert not slow.is_stale(0, 7)
    slow.seen(0, 7, now=1.0, authoritative=False)
    slow.finished(0, 1)
    assert fast.peers[0] == slow.peers[0]
    assert fast.reply_seen(0, 0, now=2.0) is True  # an engine that does not say
    # anything else goes the general way
    assert fast.reply_seen(0, 9, now=3.0) is False  # another incarnation
    assert fast.reply_seen(1, 7, now=3.0) is False  # Busy: a reply may end that
    assert fast.reply_seen(5, 7, now=3.0) is False  # not a rank of the table
    assert fast.peers[0].last_seen == 2.0 and fast.state(1) is PeerState.BUSY


@pytest.mark.anyio
async def test_replies_refresh_liveness_through_the_one_lookup_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"reply_seen": 0, "is_stale": 0}
    for name in calls:
        original = getattr(PeerTable, name)

        def counting(self: PeerTable, *a: Any, _o: Any = original, _n: str = name,
                     **k: Any) -> Any:
            calls[_n] += 1
            return _o(self, *a, **k)

        monkeypatch.setattr(PeerTable, name, counting)
    async with EngineHarness(ranks=2, setup=echo_methods) as h:
        await h.client.wait_ready(timeout=10)
        before = dict(calls)  # what wait_ready heard from the two ranks
        for i in range(5):
            assert await h.client.call("echo", i, rank=i % 2) == i
        assert calls["reply_seen"] - before["reply_seen"] == 5
        assert calls["is_stale"] == 0
        assert h.client.peers.peers[0].misses == 0


# -- result decoding ----------------------------------------------------------------------
class Point(msgspec.Struct):
    x: int
    y: int = 0


@pytest.mark.parametrize("codec", [MsgpackCodec(), JsonCodec()], ids=["msgpack", "json"])
def test_decode_result_equals_decode_value_and_caches_the_decoder(
        codec: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    issuer = CallOutcomes(codec, lambda: False)
    cases: list[tuple[Any, Any]] = [
        ({"a": [1, 2]}, Any), (Point(1, 2), Point), ([1, 2], list[int]), (None, Any),
        (3, int), ("x", int), ({"x": "no"}, Point),
    ]
    for value, tp in cases:
        raw = codec.encode_value(value)
        try:
            want: Any = codec.decode_value(raw, tp)
        except PayloadTypeError as exc:
            with pytest.raises(PayloadTypeError) as info:
                issuer.decode_result(raw, tp)
            assert str(info.value) == str(exc)
            continue
        got = issuer.decode_result(raw, tp)
        assert got == want and type(got) is type(want)
        if isinstance(got, (dict, list)):
            assert got is not issuer.decode_result(raw, tp)  # a fresh copy per holder
    assert issuer.decode_result(msgspec.Raw(b""), Any) is None  # an empty result: None
    # the common case does not go through decode_value (no copy, no lookup)
    slow = 0
    original = type(codec).decode_value

    def counting(self: Any, raw: Any, tp: Any = Any) -> Any:
        nonlocal slow
        slow += 1
        return original(self, raw, tp)

    monkeypatch.setattr(type(codec), "decode_value", counting)
    assert issuer.decode_result(codec.encode_value(Point(3)), Point) == Point(3)
    assert slow == 0
    assert Point in issuer._decoders
