"""The inbound core alone (no transport, no event loop): every admission
decision and every ``InboundRequest`` transition, for requests built by hand."""

from __future__ import annotations

from typing import Any

import pytest

from ctlwire.kernel.core.inbound_core import BadFrame, InboundCore, InboundRequest, MethodSpec
from ctlwire.states import IllegalTransition, InboundEvent, InboundState
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.envelope import Heartbeat, Reply, Request
from ctlwire.transports.transport import Dropped, Received

CODEC = MsgpackCodec()
NOW = 1000.0


def spec(name: str, *, read_only: bool = False, payload_type: Any = int) -> MethodSpec:
    fast = CODEC.fast_value_codec(payload_type)
    assert fast is not None
    return MethodSpec(name, lambda v: v, payload_type, True, False, False,
                      read_only=read_only, decode=fast[1], encode=fast[0])


def make_core(**kw: Any) -> InboundCore:
    methods = {s.name: s for s in (spec("apply"), spec("other"), spec("query", read_only=True))}
    return InboundCore(methods, CODEC, rank=0, incarnation=7, clock=lambda: NOW, **kw)


def request(rid: int, method: str = "apply", value: Any = 1, **kw: Any) -> Request:
    return Request(rid, kw.pop("rank", 0), method, CODEC.encode_value(value),
                   kw.pop("deadline", 0.0), rid, kw.pop("client", 9), **kw)


def admitted(core: InboundCore, req: Request, route: Any = b"r") -> InboundRequest:
    item = core.accept(req, route)
    assert item is not None
    assert core.admit(item) is None, "refused"
    assert item.state is InboundState.RUNNING
    return item


def refusal(core: InboundCore, req: Request, route: Any = b"r") -> Reply:
    item = core.accept(req, route)
    assert item is not None
    reply = core.admit(item)
    assert reply is not None
    return reply


def test_two_methods_using_the_same_key_both_run() -> None:
    core = make_core()
    first = admitted(core, request(1, "apply", 1, key="k"))
    core.result(first, 10)
    # same key, another method: it runs (a cache keyed on the key alone would replay 10)
    second = admitted(core, request(2, "other", 2, key="k"))
    assert second.args == (2,)
    core.result(second, 20)
    again = refusal(core, request(3, "other", 3, key="k"))
    assert again.ok and CODEC.decode_value(again.result) == 20


def test_repeating_the_key_of_a_handler_that_raised_returns_that_error() -> None:
    class Boom(Exception):
        code = 418

    core = make_core()
    item = admitted(core, request(1, key="k"))
    first = core.error(item, Boom("no"))
    assert not first.ok and first.error is not None
    repeat = refusal(core, request(2, key="k"))
    assert not repeat.ok  # not a success with no value
    assert repeat.error == first.error == repeat.error.__class__("Boom", "no", 418)
    assert core.counters["idempotent_replays"] == 1


def test_a_keyed_run_that_ends_with_no_outcome_forgets_its_key() -> None:
    core = make_core()
    item = admitted(core, request(1, key="k"))
    in_progress = refusal(core, request(2, key="k"))
    assert in_progress.error is not None and in_progress.error.type == "InProgress"
    core.cancelled(item)
    retry = admitted(core, request(3, key="k"))  # runs, not "in progress"
    assert retry.args == (1,)


def test_a_read_only_method_ignores_keys_and_fences() -> None:
    core = make_core()
    for rid in (1, 2):
        core.result(admitted(core, request(rid, "query", key="k", fence=5)), rid)
    assert len(core.results) == 0 and core.fences.high == 0


def test_only_a_fully_validated_state_changing_request_moves_the_fence() -> None:
    core = make_core()
    bad = refusal(core, request(1, "apply", "not an int", fence=500))
    assert bad.error is not None and bad.error.type == "InvalidPayload"
    assert core.fences.high == 0
    admitted(core, request(2, fence=500))
    assert core.fences.high == 500
    stale = refusal(core, request(3, fence=499))
    assert stale.error is not None and stale.error.type == "Fenced"
    ahead = refusal(core, request(4, fence=int(NOW * 1e6) + 10**12))
    assert ahead.error is not None and ahead.error.type == "FenceOutOfRange"
    assert core.counters["fenced"] == core.counters["fence_out_of_range"] == 1


@pytest.mark.parametrize(("req", "error"), [
    (request(1, "nope"), "UnknownMethod"),
    (request(1, rank=3), "WrongRank"),
    (request(1, deadline=NOW - 1), "DeadlineExpired"),
    (request(1, version=0x0900), "UnsupportedProtocolVersion"),
    (request(1, key="k" * 1000), "KeyTooLong"),
])
def test_refusals_are_typed_and_never_run(req: Request, error: str) -> None:
    core = make_core()
    reply = refusal(core, req)
    assert reply.error is not None and reply.error.type == error
    expected = InboundState.EXPIRED if error == "DeadlineExpired" else InboundState.REJECTED
    assert core.states[expected] == 1 and core.states[InboundState.RUNNING] == 0


def test_every_transition_goes_through_the_table() -> None:
    core = make_core()
    item = admitted(core, request(1))
    reply = core.result(item, 5)
    assert reply.ok and item.state is InboundState.REPLIED
    assert core.states[InboundState.REPLIED] == 1
    with pytest.raises(IllegalTransition):
        core.result(item, 6)  # Replied is final: no second reply
    fresh = core.accept(request(2), b"r")
    assert fresh is not None
    with pytest.raises(IllegalTransition):
        core.result(fresh, 6)  # never admitted: Received cannot reply


def test_a_running_request_past_its_deadline_is_not_expired_but_replied() -> None:
    core = make_core()
    item = admitted(core, request(1, deadline=NOW + 1.0))
    with pytest.raises(IllegalTransition):
        item.go(InboundEvent.EXPIRE)  # its handler runs: too late to expire it
    assert item.state is InboundState.RUNNING
    assert core.result(item, 5).ok and item.state is InboundState.REPLIED
    assert core.states[InboundState.EXPIRED] == 0 and core.counters["expired"] == 0


def test_arrive_is_accept_then_admit_and_its_moves_go_through_the_table() -> None:
    """``arrive`` makes the decisions ``accept`` then ``admit`` make, in the same
    order: Running for a plain request (one move, Received -> Running), the
    refusal for a bad one, None for a duplicate; a request admitted twice is an
    illegal move, raised by the table."""
    core = make_core()
    item = core.arrive(request(1), b"r")
    assert type(item) is InboundRequest and item.state is InboundState.RUNNING
    assert item.args == (1,) and item.spec is not None
    assert core.arrive(request(1), b"r") is None  # the same id, the same route
    assert core.counters["duplicates"] == 1 and core.counters["received"] == 2
    refused = core.arrive(request(2, value="not an int"), b"r")
    assert type(refused) is Reply and refused.error is not None
    assert refused.error.type == "InvalidPayload" and core.states[InboundState.REJECTED] == 1
    fenced = core.arrive(request(3, fence=1), b"r")  # a fence: _begin moves it
    assert type(fenced) is InboundRequest and fenced.state is InboundState.RUNNING
    assert core.fences.high == 1
    with pytest.raises(IllegalTransition):
        core.admit(item)  # already Running: Received -> Running cannot happen twice
    assert core.result(item, 5).ok and item.state is InboundState.REPLIED


def test_a_duplicate_id_from_the_same_route_is_dropped_not_from_another() -> None:
    core = make_core()
    assert core.accept(request(1), b"a") is not None
    assert core.accept(request(1), b"a") is None
    assert core.accept(request(1), b"b") is not None
    assert core.counters["duplicates"] == 1 and core.counters["received"] == 3


def test_a_result_the_codec_refuses_is_result_not_encodable() -> None:
    core = make_core()
    reply = core.result(admitted(core, request(1)), object())
    assert reply.error is not None and reply.error.type == "ResultNotEncodable"


def test_events_other_than_requests_are_counted_or_answered() -> None:
    core = make_core()
    assert core.receive(Received(Heartbeat(-1, 5, 1), route=b"r")) is None
    assert core.counters["heartbeats_received"] == 1 and core.client_last_seen == NOW
    bad = core.receive(Dropped("malformed", "bad", 10, route=b"r", request_id=42))
    assert isinstance(bad, BadFrame) and bad.reply.id == 42
    assert bad.reply.error is not None and bad.reply.error.type == "MalformedFrame"
    assert core.receive(Dropped("framing", "x", 10, route=b"r")) is None
    assert core.counters["dropped_malformed"] == core.counters["dropped_framing"] == 1
    assert isinstance(core.receive(Received(request(1), route=b"r")), InboundRequest)


def arrived(core: InboundCore, req: Request, route: Any = b"r") -> InboundRequest:
    """A request checked as it arrives, to wait before it starts (serve mode)."""
    item = core.accept(req, route)
    assert item is not None
    assert core.check(item) is None, "refused"
    assert item.state is InboundState.RECEIVED
    return item


def test_a_key_is_taken_as_its_request_arrives_so_a_repeat_is_in_progress_at_once() -> None:
    core = make_core()
    first = arrived(core, request(1, key="k"))  # waits to start
    repeat = core.accept(request(2, key="k"), b"r")
    assert repeat is not None
    in_progress = core.check(repeat)
    assert in_progress is not None and in_progress.error is not None
    assert (in_progress.error.type, in_progress.error.code) == ("InProgress", 425)
    assert core.start(first) is None
    core.result(first, 10)
    replayed = refusal(core, request(3, key="k"))  # once it ran: its outcome
    assert replayed.ok and CODEC.decode_value(replayed.result) == 10


@pytest.mark.parametrize("refused_as", ["Busy", "DeadlineExpired", "Fenced"])
def test_a_request_refused_after_it_took_its_key_forgets_it(refused_as: str) -> None:
    """Refused before it ran -- no room to queue it, its deadline passed while it
    waited, a newer fence accepted meanwhile -- it holds no key: a retry runs."""
    core = make_core()
    item = arrived(core, request(1, key="k", fence=500, deadline=NOW + 1))
    if refused_as == "Busy":
        reply = core.busy(item, "full")
    elif refused_as == "DeadlineExpired":
        reply = core.start(item, NOW + 2)
    else:
        admitted(core, request(2, "other", fence=600))
        reply = core.start(item)
    assert reply is not None and reply.error is not None and reply.error.type == refused_as
    assert len(core.results) == 0
    retry = admitted(core, request(3, key="k", fence=700))
    assert retry.args == (1,)
