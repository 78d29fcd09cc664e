"""hypothesis state machines over the sans-IO cores: RequestRegistry and AdmissionQueue.

Random sequences of register / send / wait / reply / duplicate / late / unknown /
timeout / rank loss / release against an independent model of what each reply
should be classified as; and random arrive / resume / start / decide / leave
sequences, with one holder and with several, against the FIFO guarantee.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from ctlwire.kernel.core.admission_queue import AdmissionQueue, Ticket
from ctlwire.kernel.core.fan_out_policy import Policy
from ctlwire.kernel.core.request_registry import PendingRequest, ReplyDisposition, RequestRegistry
from ctlwire.kernel.errors import EngineDead
from ctlwire.states import RequestEvent, RequestState, TicketEvent, TicketState
from ctlwire.transports.envelope import ErrorInfo, Reply

RANKS = (0, 1, 2)
NIL = msgspec.Raw(b"\xc0")
TERMINAL = {RequestState.DONE, RequestState.TIMED_OUT, RequestState.FAILED,
            RequestState.CANCELLED}


def reply(rid: int, rank: int, ok: bool) -> Reply:
    return Reply(rid, rank, 1, ok, NIL, None if ok else ErrorInfo("E", "m", 1))


class RegistryMachine(RuleBasedStateMachine):
    entries = Bundle("entries")
    cleaned = Bundle("cleaned")

    def __init__(self) -> None:
        super().__init__()
        self.outcomes: dict[int, list[RequestState]] = {}
        self.cleans: dict[int, int] = {}
        self.reg = RequestRegistry(max_tombstones=8, observer=self._observe)
        self.model_live: set[int] = set()
        self.answered: dict[int, set[int]] = {}  # ranks whose reply was stored or seen late
        self.expected_drops = {"late": 0, "duplicate": 0, "unknown": 0, "stray": 0}

    def _observe(self, entry: PendingRequest, old: RequestState, event: RequestEvent,
                 new: RequestState) -> None:
        if new in TERMINAL:
            self.outcomes.setdefault(entry.id, []).append(new)
        if event is RequestEvent.CLEAN:
            self.cleans[entry.id] = self.cleans.get(entry.id, 0) + 1

    @rule(target=entries, ranks=st.sets(st.sampled_from(RANKS), min_size=1),
          policy=st.sampled_from(list(Policy)))
    def register(self, ranks: set[int], policy: Policy) -> PendingRequest:
        entry = self.reg.register("m", sorted(ranks), policy, deadline=1.0, timeout=1.0)
        self.model_live.add(entry.id)
        self.answered[entry.id] = set()
        return entry

    @rule(entry=entries, unroutable=st.sets(st.sampled_from(RANKS)))
    def send(self, entry: PendingRequest, unroutable: set[int]) -> None:
        if entry.state is not RequestState.REGISTERED:
            return
        for rank in self.reg.plan_sends(entry):
            if not entry.is_open:
                break
            if rank in unroutable:
                self.reg.rank_failed(entry, rank, EngineDead(rank, "unroutable"))
            else:
                self.reg.sent(entry, rank)

    @rule(entry=entries)
    def wait(self, entry: PendingRequest) -> None:
        was_sent = entry.state is RequestState.SENT
        assert self.reg.awaiting(entry) == was_sent

    @rule(entry=entries, rank=st.sampled_from(RANKS), ok=st.booleans())
    def deliver(self, entry: PendingRequest, rank: int, ok: bool) -> None:
        self._deliver(entry, rank, ok)

    @rule(entry=cleaned, rank=st.sampled_from(RANKS), ok=st.booleans())
    def deliver_after_cleanup(self, entry: PendingRequest, rank: int, ok: bool) -> None:
        self._deliver(entry, rank, ok)

    def _deliver(self, entry: PendingRequest, rank: int, ok: bool) -> None:
        before = entry.state
        stored_before = rank in entry.replies
        disp, _ = self.reg.on_reply(reply(entry.id, rank, ok))
        # the independent expectation
        if entry.id not in self.model_live:
            tomb = entry.id in self.reg._tombstones
            seen = rank in self.answered[entry.id]
            if tomb and rank not in entry.ranks:
                want = ReplyDisposition.STRAY  # a tombstone never grows past its ranks
            else:
                want = ReplyDisposition.DUPLICATE if tomb and seen else ReplyDisposition.LATE
        elif rank not in entry.ranks or before is RequestState.REGISTERED:
            want = ReplyDisposition.STRAY
        elif stored_before or rank in self.answered[entry.id]:
            want = ReplyDisposition.DUPLICATE
        elif before not in (RequestState.SENT, RequestState.AWAITING) or rank in entry.errors:
            want = ReplyDisposition.LATE
        else:
            want = None  # accepted or completed
        if want is None:
            assert disp in (ReplyDisposition.ACCEPTED, ReplyDisposition.COMPLETED)
            assert (disp is ReplyDisposition.COMPLETED) == (entry.state in TERMINAL)
        else:
            assert disp is want, (disp, want, entry)
            self.expected_drops[want.value] += 1
        if want is None or (want is ReplyDisposition.LATE and rank in entry.ranks):
            self.answered[entry.id].add(rank)

    @rule(entry=entries, rank=st.sampled_from(RANKS), peer=st.sampled_from(RANKS), ok=st.booleans())
    def deliver_from_another_connection(self, entry: PendingRequest, rank: int, peer: int,
                                        ok: bool) -> None:
        """A reply claiming ``rank`` that came in on ``peer``'s connection."""
        if peer == rank:
            return
        before = (entry.state, dict(entry.replies), entry.answered)
        disp, _ = self.reg.on_reply(reply(entry.id, rank, ok), peer=peer)
        assert disp is ReplyDisposition.STRAY, (disp, rank, peer, entry)
        assert (entry.state, entry.replies, entry.answered) == before  # nothing applied
        self.expected_drops["stray"] += 1

    @rule(rid=st.integers(min_value=1, max_value=2**62))
    def unknown_reply(self, rid: int) -> None:
        if self.reg._ids.issued(rid):
            return
        disp, entry = self.reg.on_reply(reply(rid, 0, True))
        assert disp is ReplyDisposition.UNKNOWN and entry is None
        self.expected_drops["unknown"] += 1

    @rule(entry=entries)
    def timeout(self, entry: PendingRequest) -> None:
        was_open = entry.is_open
        assert self.reg.expire(entry) == was_open

    @rule(rank=st.sampled_from(RANKS))
    def lose_rank(self, rank: int) -> None:
        decided = self.reg.fail_rank(rank, EngineDead, EngineDead)
        for entry in decided:
            assert entry.state in (RequestState.DONE, RequestState.FAILED)

    @rule(target=cleaned, entry=consumes(entries))
    def release(self, entry: PendingRequest) -> PendingRequest:
        assert self.reg.release(entry)
        self.model_live.discard(entry.id)
        assert entry.state is RequestState.CLEANED
        return entry

    @invariant()
    def exactly_one_outcome_and_clean_accounting(self) -> None:
        for rid, outs in self.outcomes.items():
            assert len(outs) == 1, (rid, outs)
        for rid, n in self.cleans.items():
            assert n == 1 and rid not in self.model_live
            assert len(self.outcomes[rid]) == 1

    @invariant()
    def live_entries_equal_model(self) -> None:
        assert {e.id for e in self.reg.live()} == self.model_live
        self.reg.check_invariants()

    @invariant()
    def drops_are_counted(self) -> None:
        s = self.reg.stats
        assert {"late": s.late, "duplicate": s.duplicate, "unknown": s.unknown,
                "stray": s.stray} == self.expected_drops
        assert self.reg.tombstone_count <= 8

    def teardown(self) -> None:
        # every holder lets go: nothing stays behind, in the map or in its per-rank index
        for entry in self.reg.live():
            assert self.reg.release(entry)
        assert self.reg.live_count == 0
        self.reg.check_invariants()


TestRegistry = RegistryMachine.TestCase
TestRegistry.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


class AdmissionMachine(RuleBasedStateMachine):
    tickets = Bundle("tickets")

    def __init__(self) -> None:
        super().__init__()
        self.q = AdmissionQueue("m")
        self.q.observers.append(self._observe)
        self.admitted_order: list[int] = []
        self.all: dict[int, Ticket] = {}
        self.woken: set[int] = set()

    def _observe(self, t: Ticket, old: TicketState, ev: TicketEvent, new: TicketState) -> None:
        if ev is TicketEvent.ADMIT:
            # every ticket that arrived earlier and is not yet served must have left
            prev = self.admitted_order[-1] if self.admitted_order else 0
            assert t.seq > prev, "admission out of arrival order"
            for seq in range(prev + 1, t.seq):
                assert self.all[seq].state is TicketState.ABANDONED, f"skipped #{seq}"
            self.admitted_order.append(t.seq)

    @rule(target=tickets)
    def arrive(self) -> Ticket:
        t = self.q.arrive()
        self.all[t.seq] = t
        if t.state is TicketState.ADMITTED:
            self.woken.add(t.seq)
        return t

    @precondition(lambda self: self.q.holder is not None)
    @rule()
    def holder_resumes(self) -> None:
        holder = self.q.holder
        assert holder is not None and holder.seq in self.woken
        self.q.resumed(holder)

    @rule(t=consumes(tickets))
    def leave(self, t: Ticket) -> None:
        """The caller ends: returns, raises, times out or is cancelled, wherever it was."""
        was = t.state
        nxt = self.q.leave(t)
        if was is TicketState.ADMITTED:
            assert t.state is TicketState.RELEASED
        elif was is TicketState.QUEUED:
            assert t.state is TicketState.ABANDONED and nxt is None
        if nxt is not None:
            assert nxt.state is TicketState.ADMITTED and self.q.holder is nxt
            self.woken.add(nxt.seq)

    @invariant()
    def at_most_one_in_flight(self) -> None:
        admitted = [t for t in self.all.values() if t.state is TicketState.ADMITTED]
        assert len(admitted) <= 1
        assert (admitted[0] if admitted else None) is self.q.holder
        self.q.check_invariants()

    @invariant()
    def nobody_waits_on_a_free_mailbox(self) -> None:
        if self.q.depth:
            assert self.q.holder is not None

    def teardown(self) -> None:
        # everyone leaves in any order: the queue drains, no ticket left behind
        for t in list(self.all.values()):
            if t.state is TicketState.ADMITTED:
                self.q.leave(t)
        while self.q.holder is not None:
            self.q.leave(self.q.holder)
        assert self.q.depth == 0
        assert all(t.state in (TicketState.RELEASED, TicketState.ABANDONED)
                   for t in self.all.values())


TestAdmission = AdmissionMachine.TestCase
TestAdmission.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)


def test_a_reply_from_another_connection_is_stray_and_not_applied() -> None:
    """The envelope says rank 0; it came in on rank 1's connection: counted as
    stray, neither stored as rank 0's answer nor as rank 1's."""
    reg = RequestRegistry()
    entry = reg.register("m", (0, 1))
    assert reg.plan_sends(entry) == [0, 1]
    disp, found = reg.on_reply(reply(entry.id, 0, True), peer=1)
    assert (disp, found) == (ReplyDisposition.STRAY, entry)
    assert reg.stats.stray == 1 and entry.replies == {} and entry.answered == 0
    assert entry.state is RequestState.SENT
    # each rank's own reply on its own connection still completes it
    assert reg.on_reply(reply(entry.id, 1, True), peer=1)[0] is ReplyDisposition.ACCEPTED
    assert reg.on_reply(reply(entry.id, 0, True), peer=0)[0] is ReplyDisposition.COMPLETED
    assert reg.stats.stray == 1


def test_released_requests_leave_no_per_rank_index_entry() -> None:
    reg = RequestRegistry()
    entries = [reg.register("m", (rank, rank + 1)) for rank in range(0, 64, 2)]
    shared = reg.register("m", (0,))
    for entry in entries:
        reg.plan_sends(entry)
        assert reg.release(entry)
        reg.check_invariants()  # rank 0 still indexes ``shared``; every other rank nothing
    assert reg.release(shared)
    reg.check_invariants()
    assert reg.live_count == 0


def test_policy_table() -> None:
    from ctlwire.kernel.core.fan_out_policy import Decision, decide

    d: Any = decide
    assert d(Policy.ALL, 3, 2, 2, 2) is Decision.PENDING
    assert d(Policy.ALL, 3, 0, 1, 3) is Decision.COMPLETE
    assert d(Policy.ALL, 3, 0, 0, 3) is Decision.FAIL
    assert d(Policy.QUORUM, 3, 2, 2, 2) is Decision.COMPLETE
    assert d(Policy.QUORUM, 3, 0, 1, 2) is Decision.FAIL
    assert d(Policy.QUORUM, 4, 2, 2, 2) is Decision.PENDING
    assert d(Policy.FIRST, 3, 1, 1, 1) is Decision.COMPLETE
    assert d(Policy.FIRST, 3, 0, 2, 3) is Decision.FAIL


class PipelinedAdmissionMachine(RuleBasedStateMachine):
    """``holders`` k in 1..3: random arrive / resume / start / decide / leave against
    an independent model: at most k hold a slot and one starts at a time, nobody
    waits while a slot is free and no one starts, admission in arrival order and
    only by hand-off (the ticket a call returns), the turn to leave is the oldest
    admitted ticket's that has not left."""

    tickets = Bundle("pipelined_tickets")

    def __init__(self) -> None:
        super().__init__()
        self.q = AdmissionQueue("m")
        self.all: dict[int, Ticket] = {}
        self.admitted_now: list[Ticket] = []

    @initialize(holders=st.integers(1, 3))
    def build(self, holders: int) -> None:
        self.q = AdmissionQueue("m", self._observe, holders=holders)

    def _observe(self, t: Ticket, old: TicketState, ev: TicketEvent, new: TicketState) -> None:
        if ev is TicketEvent.ADMIT:
            self.admitted_now.append(t)

    def _in(self, *states: TicketState) -> list[Ticket]:
        return [t for _, t in sorted(self.all.items()) if t.state in states]

    def _handed(self, nxt: Ticket | None) -> None:
        """The call admitted exactly the ticket it returned: the oldest queued one."""
        assert self.admitted_now == ([] if nxt is None else [nxt])
        if nxt is not None:
            assert nxt.state is TicketState.ADMITTED and self.q.starting is nxt
            earlier = [t for s, t in self.all.items() if s < nxt.seq]
            assert all(t.state is not TicketState.QUEUED for t in earlier), "overtaken"
        self.admitted_now.clear()

    @rule(target=tickets)
    def arrive(self) -> Ticket:
        free = (len(self._in(TicketState.ADMITTED, TicketState.STARTED)) < self.q.holders
                and not self._in(TicketState.ADMITTED) and not self._in(TicketState.QUEUED))
        t = self.q.arrive()
        self.all[t.seq] = t
        assert t.state is (TicketState.ADMITTED if free else TicketState.QUEUED)
        self._handed(t if free else None)
        return t

    @rule(t=tickets)
    def resume(self, t: Ticket) -> None:
        if t.state is TicketState.ADMITTED and not t.resumed:
            self.q.resumed(t)
            assert t.resumed

    @rule(t=tickets)
    def start(self, t: Ticket) -> None:
        was = t.state
        nxt = self.q.start(t)
        assert t.state is (TicketState.STARTED if was is TicketState.ADMITTED else was)
        self._handed(nxt)

    @rule(t=tickets)
    def decide(self, t: Ticket) -> None:
        was = t.state
        nxt = self.q.decide(t)
        held = was in (TicketState.ADMITTED, TicketState.STARTED)
        assert t.state is (TicketState.DECIDED if held else was)
        self._handed(nxt)

    @rule(t=tickets)
    def leave(self, t: Ticket) -> None:
        was = t.state
        nxt = self.q.leave(t)
        assert t.state is {TicketState.QUEUED: TicketState.ABANDONED,
                           TicketState.ADMITTED: TicketState.RELEASED,
                           TicketState.STARTED: TicketState.RELEASED,
                           TicketState.DECIDED: TicketState.RELEASED}.get(was, was)
        self._handed(nxt)

    @invariant()
    def slots_starts_and_turns_match_the_model(self) -> None:
        q = self.q
        holding = self._in(TicketState.ADMITTED, TicketState.STARTED)
        starting = self._in(TicketState.ADMITTED)
        queued = self._in(TicketState.QUEUED)
        not_left = self._in(TicketState.ADMITTED, TicketState.STARTED, TicketState.DECIDED)
        assert len(holding) <= q.holders and len(starting) <= 1
        assert q.in_flight == len(holding) and q.busy is bool(holding)
        assert q.holder is (holding[0] if holding else None)
        assert q.depth == len(queued) and q.queued() == queued
        assert q.admitted() == not_left
        if queued:  # nobody waits while a slot is free and no one starts
            assert starting or len(holding) == q.holders
        assert q.next_out() is (not_left[0] if not_left else None)
        for t in self.all.values():
            assert q.turn(t) is bool(not_left and t is not_left[0]), t
        q.check_invariants()

    def teardown(self) -> None:
        # everyone leaves, oldest admitted first; the queue drains
        for _ in range(len(self.all)):
            out = self.q.next_out()
            if out is None and not self.q.depth:
                break
            self.q.leave(out if out is not None else self.q.queued()[0])
        assert all(t.state in (TicketState.RELEASED, TicketState.ABANDONED)
                   for t in self.all.values())
        assert self.q.in_flight == 0 and self.q.admitted_total == sum(
            t.state is TicketState.RELEASED for t in self.all.values())


TestPipelinedAdmission = PipelinedAdmissionMachine.TestCase
TestPipelinedAdmission.settings = settings(max_examples=300, stateful_step_count=50,
                                           deadline=None)
