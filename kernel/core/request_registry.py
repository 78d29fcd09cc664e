"""The request map: every pending control request, from registration to cleanup.

:class:`RequestRegistry` is a synchronous, sans-IO core: the shells report what
happened (a request registered, the ranks to send it to planned, each rank's frame
handed over or failed, the caller waiting, a reply, an expiry, a lost rank, the
last holder leaving) and it says what follows; it never awaits, sleeps or touches
a socket. The client's :class:`~ctlwire.kernel.client.call_issuer.CallIssuer` and
:class:`~ctlwire.kernel.client.waiting_sends.WaitingSends`, its watching
:class:`~ctlwire.kernel.client.fan_out_mailbox.FanOutMailbox`, the
:class:`~ctlwire.kernel.primitives.own_io_fan_out.OwnIoFanOut` and the
interleaving explorer drive the very same object.

Guarantees:

* **Register before send.** An entry exists before any frame for it can leave:
  the only way to obtain a request id is :meth:`RequestRegistry.register`, and
  the ranks to send to come from :meth:`~RequestRegistry.plan_sends`, which moves
  the entry to Sent first, so a reply never finds its request missing or
  Registered; one that beats the caller's wait (entry still ``Sent``) completes it.
* **Delivery is known per rank.** A rank counts as sent once the shell reports its
  frame handed over (:meth:`~RequestRegistry.sent`); a rank lost before that fails
  with the error for a frame never sent, after it with the error for one that may
  have run (:meth:`~RequestRegistry.fail_rank`).
* **Exactly one outcome.** An entry reaches exactly one terminal state (Done,
  TimedOut, Failed, Cancelled) through the ``ControlRequest`` table; anything
  later is counted, never applied.
* **Cleanup on every path.** :meth:`RequestRegistry.release` by the last
  holder moves the entry to Cleaned and removes it; lookup, routing and cleanup
  are O(1) (O(live requests to that rank) for :meth:`fail_rank`).
* **Late, duplicate, unknown.** Cleaned ids leave a tombstone (bounded, oldest
  evicted first) recording which ranks had answered, so a late reply and a
  duplicate are told apart; ids never issued are counted as unknown.
* **Nothing a peer sends grows a set.** A tombstone holds the ranks its
  request addressed (a reference to the entry's tuple) and at most that many
  answered ranks: a reply claiming any other rank is counted as stray.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, Protocol

from ctlwire.kernel.core.fan_out_policy import Decision, Policy, decide
from ctlwire.kernel.core.request_id import RequestIdAllocator
from ctlwire.kernel.errors import NotDelivered
from ctlwire.states import CONTROL_REQUEST_TABLE, RequestEvent, RequestState
from ctlwire.transports.envelope import Reply

__all__ = ["PendingRequest", "RegistryStats", "ReplyDisposition", "RequestRegistry", "Tomb",
           "TransitionObserver", "Waiter"]

_S = RequestState
_E = RequestEvent
_OPEN = frozenset({_S.REGISTERED, _S.SENT, _S.AWAITING})
_TERMINAL = CONTROL_REQUEST_TABLE.terminal


class Tomb:
    """What is left of a cleaned request: the ranks it addressed and those that answered.

    A late or duplicate reply to a cleaned request is told apart by its tombstone.
    ``answered`` only ever holds ranks of ``ranks``, so a tombstone's size is
    bounded by its request's fan-out whatever replies arrive later. A request
    every rank answered leaves no set of its own (made on first use)."""

    __slots__ = ("_answered", "ranks")

    def __init__(self, ranks: tuple[int, ...], answered: set[int] | None) -> None:
        self.ranks = ranks
        self._answered = answered  # None: every rank of ``ranks`` answered

    @property
    def answered(self) -> set[int]:
        answered = self._answered
        if answered is None:
            answered = self._answered = set(self.ranks)
        return answered


class _Step:
    """One legal ``(state, event) -> state`` of CONTROL_REQUEST_TABLE and how often it ran.

    A per-registry copy of the table whose cells also carry the counter and the
    new state's properties: one lookup per transition instead of several hashed
    enum keys (Enum hashing is a Python-level call).
    """

    __slots__ = ("count", "event", "new", "old", "open", "terminal")

    def __init__(self, old: RequestState, event: RequestEvent, new: RequestState) -> None:
        self.old = old
        self.event = event
        self.new = new
        self.open = new in _OPEN
        self.terminal = new in _TERMINAL
        self.count = 0


class Waiter(Protocol):
    """What a shell hands in to be woken: ``anyio.Event`` fits."""

    def set(self) -> None: ...


class ReplyDisposition(Enum):
    """What the registry did with a reply."""

    ACCEPTED = "accepted"          # stored; the request still waits for other ranks
    COMPLETED = "completed"        # stored; the request reached its outcome
    LATE = "late"                  # its request was already decided or cleaned
    DUPLICATE = "duplicate"        # this rank had already answered this request
    UNKNOWN = "unknown"            # the id was never issued by this registry
    STRAY = "stray"                # the request was not addressed to this rank


class PendingRequest:
    """One entry of the request map. Mutated only by its registry."""

    __slots__ = ("answered", "deadline", "errors", "id", "is_open", "late_ranks",
                 "left_out", "method", "ok", "policy", "ranks", "refs", "replies", "sent_ranks",
                 "state", "timeout", "waiter")

    def __init__(self, request_id: int, method: str, ranks: tuple[int, ...], policy: Policy,
                 deadline: float | None, timeout: float, waiter: Waiter | None) -> None:
        self.id = request_id
        self.method = method
        self.ranks = ranks
        self.policy = policy
        self.deadline = deadline
        self.timeout = timeout
        self.waiter = waiter
        self.state = _S.REGISTERED
        # True while Registered, Sent or Awaiting; kept in step with ``state`` by the registry
        self.is_open = True
        self.replies: dict[int, Reply] = {}
        self.errors: dict[int, Exception] = {}
        self.sent_ranks: list[int] = []  # the ranks whose frame was handed over
        self.late_ranks: set[int] | None = None
        # the present ranks a fan-out without explicit ranks did not address, and why
        # (set by the caller before the first send; read by observers)
        self.left_out: dict[int, str] | None = None
        self.ok = 0
        self.answered = 0
        self.refs = 1

    @property
    def is_terminal(self) -> bool:
        return self.state in _TERMINAL

    def wake(self) -> None:
        """Tell whoever waits for this request's decision: its waiter, if it has one."""
        waiter = self.waiter
        if waiter is not None:
            waiter.set()

    def outstanding(self) -> list[int]:
        """Ranks that have neither answered nor failed."""
        return [r for r in self.ranks if r not in self.replies and r not in self.errors]

    def __repr__(self) -> str:
        return (f"<PendingRequest {self.id} {self.method!r} {self.state.name} "
                f"ranks={list(self.ranks)} settled={len(self.replies) + len(self.errors)}>")


TransitionObserver = Callable[[PendingRequest, RequestState, RequestEvent, RequestState], None]


@dataclass
class RegistryStats:
    """Counters (monotonic) of one registry."""

    registered: int = 0
    cleaned: int = 0
    late: int = 0
    duplicate: int = 0
    unknown: int = 0
    stray: int = 0
    # the registry's transition cells, which count as they run (see ``_Step``)
    _steps: list[_Step] = field(default_factory=list, repr=False)

    @property
    def transitions(self) -> dict[tuple[RequestState, RequestEvent], int]:
        """How often each ``(state, event)`` transition ran (those that ran at least once)."""
        return {(s.old, s.event): s.count for s in self._steps if s.count}

    @property
    def outcomes(self) -> dict[RequestState, int]:
        """How many entries reached each terminal state."""
        out: dict[RequestState, int] = {}
        for s in self._steps:
            if s.terminal and s.count:
                out[s.new] = out.get(s.new, 0) + s.count
        return out

    def snapshot(self) -> dict[str, Any]:
        return {
            "registered": self.registered,
            "cleaned": self.cleaned,
            "late": self.late,
            "duplicate": self.duplicate,
            "unknown": self.unknown,
            "stray": self.stray,
            "transitions": {f"{s.name}--{e.value}": n for (s, e), n in self.transitions.items()},
            "outcomes": {s.name: n for s, n in self.outcomes.items()},
        }


class RequestRegistry:
    """The request map (sans-IO). See the module docstring for its guarantees."""

    def __init__(self, *, max_tombstones: int = 10_000, incarnation: int | None = None,
                 observer: TransitionObserver | None = None) -> None:
        if max_tombstones < 0:
            raise ValueError("max_tombstones must be >= 0")
        self._ids = RequestIdAllocator(incarnation)
        self._live: dict[int, PendingRequest] = {}
        self._by_rank: dict[int, dict[int, PendingRequest]] = {}
        self._tombstones: OrderedDict[int, Tomb] = OrderedDict()
        self.max_tombstones = max_tombstones
        self.observers: list[TransitionObserver] = [observer] if observer else []
        self._apply = CONTROL_REQUEST_TABLE.apply
        self._steps: dict[RequestState, dict[RequestEvent, _Step]] = {}
        for (old, event), new in CONTROL_REQUEST_TABLE:
            self._steps.setdefault(old, {})[event] = _Step(old, event, new)
        self.stats = RegistryStats(_steps=[c for row in self._steps.values() for c in row.values()])

    # -- gauges --------------------------------------------------------------
    @property
    def incarnation(self) -> int:
        return self._ids.incarnation

    @property
    def live_count(self) -> int:
        return len(self._live)

    @property
    def tombstone_count(self) -> int:
        return len(self._tombstones)

    @property
    def tombstones(self) -> Mapping[int, Tomb]:
        """The tombstones kept, oldest first: request id -> :class:`Tomb` (a read-only
        view; at most ``max_tombstones``)."""
        return MappingProxyType(self._tombstones)

    def get(self, request_id: int) -> PendingRequest | None:
        return self._live.get(request_id)

    def live(self) -> list[PendingRequest]:
        return list(self._live.values())

    # -- transitions ---------------------------------------------------------
    def _go(self, entry: PendingRequest, event: RequestEvent) -> None:
        old = entry.state
        try:
            step = self._steps[old][event]
        except KeyError:
            self._apply(old, event, entry.id)  # raises IllegalTransition
            raise
        new = entry.state = step.new
        entry.is_open = step.open
        step.count += 1
        for observer in self.observers:
            observer(entry, old, event, new)

    def _decide(self, entry: PendingRequest) -> bool:
        """Apply the policy; True when the entry just reached Done or Failed."""
        answered = entry.answered
        settled = answered + len(entry.errors)
        if entry.state is _S.REGISTERED:
            # nothing was sent yet: only a complete failure can be decided here
            if settled < len(entry.ranks):
                return False
            self._go(entry, _E.FAIL)
            return True
        decision = decide(entry.policy, len(entry.ranks), entry.ok, answered, settled)
        if decision is Decision.PENDING:
            return False
        self._go(entry, _E.COMPLETE if decision is Decision.COMPLETE else _E.FAIL)
        return True

    # -- events from the shell ----------------------------------------------
    def register(self, method: str, ranks: Sequence[int], policy: Policy = Policy.ALL, *,
                 deadline: float | None = None, timeout: float = 0.0,
                 waiter: Waiter | None = None) -> PendingRequest:
        """A new entry in Registered, holding one reference. Its id is fresh."""
        # (one rank, already a tuple: the common single call, nothing to de-duplicate)
        rank_tuple = (ranks if len(ranks) == 1 and type(ranks) is tuple
                      else tuple(dict.fromkeys(ranks)))
        if not rank_tuple:
            raise ValueError("a request needs at least one rank")
        entry = PendingRequest(self._ids.next(), method, rank_tuple, policy, deadline, timeout,
                               waiter)
        self._live[entry.id] = entry
        by_rank = self._by_rank
        for rank in rank_tuple:
            bucket = by_rank.get(rank)
            if bucket is None:
                bucket = by_rank[rank] = {}
            bucket[entry.id] = entry
        self.stats.registered += 1
        return entry

    def plan_sends(self, entry: PendingRequest,
                   is_lost: Callable[[int], bool] | None = None) -> list[int]:
        """The ranks of ``entry`` to hand a frame to, in order, once: the entry moves
        to Sent first (empty when it is no longer Registered). Ranks ``is_lost``
        names fail NotDelivered instead."""
        if entry.state is not _S.REGISTERED:
            return []
        ranks = entry.ranks
        if is_lost is None or not any(map(is_lost, ranks)):
            self._go(entry, _E.SEND)  # the common case: one transition for every rank
            return list(ranks)
        for rank in ranks:
            if is_lost(rank):
                self.rank_failed(entry, rank, NotDelivered(rank, "lost (not sent)"))
        if not entry.is_open:
            return []  # every rank was lost
        self._go(entry, _E.SEND)
        if self._decide(entry):
            return []  # the policy cannot be met any more
        return [r for r in ranks if r not in entry.errors]

    def sent(self, entry: PendingRequest, rank: int) -> None:
        """``rank``'s frame was handed to the transport: a loss of ``rank`` from now
        on means its request may have run."""
        entry.sent_ranks.append(rank)

    def awaiting(self, entry: PendingRequest) -> bool:
        """The caller reached its wait. False when the outcome is already known
        (the reply beat the wait), in which case there is nothing to wait for."""
        if entry.state is _S.SENT:
            self._go(entry, _E.WAIT)
            return True
        return False

    def rank_failed(self, entry: PendingRequest, rank: int, error: Exception) -> bool:
        """``rank`` cannot answer ``entry`` (unroutable, dead). True when this
        decided the entry (Done or Failed)."""
        if not entry.is_open or rank in entry.replies or rank in entry.errors:
            return False
        if rank not in entry.ranks:
            raise ValueError(f"rank {rank} is not addressed by request {entry.id}")
        entry.errors[rank] = error
        return self._decide(entry)

    def on_reply(self, reply: Reply, peer: int | None = None
                 ) -> tuple[ReplyDisposition, PendingRequest | None]:
        """Route one reply by ``(id, rank)``. Never raises for bad input: a
        reply that does not belong is classified and counted."""
        rank = reply.rank if peer is None else peer
        entry = self._live.get(reply.id)
        stats = self.stats
        if entry is None:
            tomb = self._tombstones.get(reply.id)
            if tomb is not None:
                if rank != reply.rank or rank not in tomb.ranks:
                    stats.stray += 1  # never grows the tombstone
                    return ReplyDisposition.STRAY, None
                if rank in tomb.answered:
                    stats.duplicate += 1
                    return ReplyDisposition.DUPLICATE, None
                tomb.answered.add(rank)
                stats.late += 1
                return ReplyDisposition.LATE, None
            if self._ids.issued(reply.id):
                stats.late += 1  # cleaned so long ago its tombstone was evicted
                return ReplyDisposition.LATE, None
            stats.unknown += 1
            return ReplyDisposition.UNKNOWN, None
        if rank != reply.rank or rank not in entry.ranks or entry.state is _S.REGISTERED:
            stats.stray += 1
            return ReplyDisposition.STRAY, entry
        if rank in entry.replies:
            stats.duplicate += 1
            return ReplyDisposition.DUPLICATE, entry
        late = entry.late_ranks
        if late is not None and rank in late:
            stats.duplicate += 1
            return ReplyDisposition.DUPLICATE, entry
        if not entry.is_open or rank in entry.errors:
            # decided already (first/quorum), or the rank was given up on
            if late is None:
                late = entry.late_ranks = set()
            late.add(rank)
            stats.late += 1
            return ReplyDisposition.LATE, entry
        entry.replies[rank] = reply
        entry.answered += 1
        if reply.ok:
            entry.ok += 1
        if entry.policy is Policy.ALL:
            # what _decide says for ALL (an entry that got a reply is past Registered):
            # others to wait for, else complete (this rank answered)
            if entry.answered + len(entry.errors) < len(entry.ranks):
                return ReplyDisposition.ACCEPTED, entry
            self._go(entry, _E.COMPLETE)
            return ReplyDisposition.COMPLETED, entry
        if self._decide(entry):
            return ReplyDisposition.COMPLETED, entry
        return ReplyDisposition.ACCEPTED, entry

    def expire(self, entry: PendingRequest) -> bool:
        """The deadline passed. True when this moved the entry to TimedOut."""
        if entry.is_open:
            self._go(entry, _E.EXPIRE)
            return True
        return False

    def fail_open(self, error: Callable[[int], Exception]) -> list[PendingRequest]:
        """Every open entry fails now (the shell is closing): each rank that has neither
        answered nor failed gets ``error(rank)``. Returns the entries this decided."""
        decided = [e for e in self._live.values() if e.is_open]
        for entry in decided:
            for rank in entry.outstanding():
                if self.rank_failed(entry, rank, error(rank)):
                    break
            if entry.is_open:
                self._go(entry, _E.FAIL)
        return decided

    def fail_rank(self, rank: int, error: Callable[[int], Exception],
                  unsent: Callable[[int], Exception]) -> list[PendingRequest]:
        """``rank`` is lost: every open entry still waiting on it gets ``error(rank)``
        for that rank, or ``unsent(rank)`` when its frame was never handed over
        (:meth:`sent`). Returns the entries this decided."""
        bucket = self._by_rank.get(rank)
        if not bucket:
            return []
        decided = []
        for entry in list(bucket.values()):
            if entry.is_open and rank not in entry.replies and rank not in entry.errors:
                entry.errors[rank] = (error if rank in entry.sent_ranks else unsent)(rank)
                if self._decide(entry):
                    decided.append(entry)
        return decided

    def retain(self, entry: PendingRequest) -> None:
        """One more holder (a watcher sharing the in-flight request)."""
        if entry.state is _S.CLEANED:
            raise ValueError(f"request {entry.id} is already cleaned")
        entry.refs += 1

    def release(self, entry: PendingRequest) -> bool:
        """One holder is done with ``entry`` (on every path: outcome, timeout,
        cancellation, exception). The last one cancels it if still open and
        cleans it. True when the entry was cleaned by this call."""
        if entry.state is _S.CLEANED:
            return False
        entry.refs -= 1
        if entry.refs > 0:
            return False
        if entry.is_open:
            self._go(entry, _E.CANCEL)
        self._go(entry, _E.CLEAN)
        rid = entry.id
        del self._live[rid]
        by_rank = self._by_rank
        for rank in entry.ranks:  # a live entry is indexed under each of its ranks
            bucket = by_rank[rank]
            del bucket[rid]
            if not bucket:
                del by_rank[rank]
        if self.max_tombstones:
            tombs = self._tombstones
            replies = entry.replies
            answered: set[int] | None = None  # every rank answered (late ones are of them)
            if len(replies) < len(entry.ranks):
                answered = set(replies)
                if entry.late_ranks:
                    answered |= entry.late_ranks
            tombs[rid] = Tomb(entry.ranks, answered)
            if len(tombs) > self.max_tombstones:
                tombs.popitem(last=False)
        entry.waiter = None
        self.stats.cleaned += 1
        return True

    def check_invariants(self) -> None:
        """Raise AssertionError when the internal indexes disagree (tests, explorer)."""
        for rid, entry in self._live.items():
            assert entry.id == rid
            assert entry.state is not _S.CLEANED, entry
            assert entry.refs > 0, entry
            assert entry.is_open == (entry.state in _OPEN), entry
            for rank in entry.ranks:
                assert self._by_rank[rank][rid] is entry
        assert all(self._by_rank.values()), "a per-rank index entry holds no request"
        indexed = sum(len(b) for b in self._by_rank.values())
        assert indexed == sum(len(e.ranks) for e in self._live.values())
        assert len(self._tombstones) <= self.max_tombstones
        assert not (self._tombstones.keys() & self._live.keys())
        for tomb in self._tombstones.values():
            assert tomb.answered <= set(tomb.ranks), tomb.answered
