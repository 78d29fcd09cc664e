"""Which ranks belong to the fleet, and which of them may be routed to (sans-IO).

A :class:`Membership` is the client's view of the set of engine ranks, fed by
membership events from a backend (static: the ``ranks=`` a client is built
with; a store with leases and watches) or by the caller. Each event carries a
rank, an address, an incarnation (the engine process's) and a revision::

    view = Membership([0, 1, 2], alive=peers.is_live)
    change = view.apply(MembershipEvent("add", 3, "tcp://h:5555", incarnation=7,
                                        revision=12))
    change.kind is ChangeKind.ADDED                  # rank 3 present, not admitted
    view.admit(3)                                    # now routable

Each present rank is in a state of the ``RankMembership`` machine
(:mod:`ctlwire.states.rank_membership`), which every change goes through.

Guarantees:

* **The store says who should be there; heartbeats say who is alive.** A
  ``"lost"`` event (the rank's registration vanished without an explicit
  removal: its lease expired or was revoked) never removes a rank that is
  alive (``alive(rank)``, the client's liveness): it stays present, admitted
  and routed to, in ``REGISTRATION_LOST`` (``REGISTRATION_LOST`` change), until
  it registers again (``RESTORED`` when the incarnation is the same; its
  admission is kept). Only an explicit ``"remove"`` (an operator deleted it,
  or the engine deregistered) or :meth:`Membership.rank_died` of a rank whose
  registration is lost (or a ``"lost"`` event for a rank that is not alive)
  removes it (``REMOVED``, with the ``reason`` its calls fail with).
* **Revisions only move forward, per rank.** An event whose revision is not
  newer than the last one applied for its rank (present or removed) is stale:
  ignored and counted (``stale_revision``). A removed rank's last revision is
  kept (a bounded number of them, oldest forgotten first), so a late ``add``
  replayed by a watch cannot bring back a rank removed after it. Events
  without a revision (``0``) take the view's next one.
* **Incarnations are fenced.** An event naming a lower incarnation than the
  present member's is ignored and counted (``fenced_incarnation``): an older
  registration never replaces (nor, deleted, removes) a newer one. A higher
  incarnation is a re-registration (``REREGISTERED``): the member must be
  admitted again. ``"remove"`` and ``"lost"`` with incarnation 0 apply to
  whichever incarnation is present.
* **Joining ranks are not admitted.** Ranks given at construction are admitted
  (today's static behaviour); a rank added later (or re-registered) is present
  but not admitted until :meth:`Membership.admit`, unless the view was built
  with ``admit_on_join=True``.
* **Bounded.** At most ``max_members`` present ranks (further adds are refused
  and counted, ``refused_full``) and as many remembered removals.

*Present* (in this view), *alive* (heartbeats: the client's peer table) and
*admissible* (present, admitted, not quarantined, and meeting the client's
admission condition) are separate facts; :meth:`exclusion` says why a present
rank is not admissible.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Literal

from ctlwire.states import RANK_MEMBERSHIP_TABLE, MemberEvent, MemberState

__all__ = ["ChangeKind", "Member", "Membership", "MembershipChange", "MembershipEvent"]

_REGISTERED = MemberState.REGISTERED
_LOST = MemberState.REGISTRATION_LOST


@dataclass(frozen=True)
class MembershipEvent:
    """What a membership backend reports: ``kind`` ``"add"``/``"update"`` (the rank
    is registered with this address and incarnation: an upsert), ``"remove"`` (an
    explicit removal) or ``"lost"`` (its registration vanished without one: a
    lease expired or was revoked); ``revision`` orders the events of one rank
    (0: the view's next)."""

    kind: Literal["add", "update", "remove", "lost"]
    rank: int
    address: str = ""
    incarnation: int = 0
    revision: int = 0


@dataclass(frozen=True)
class Member:
    """A present rank: where it is, which registration, whether it is admitted, and
    whether its registration is current (``REGISTERED``) or lost (``REGISTRATION_LOST``)."""

    rank: int
    address: str = ""
    incarnation: int = 0
    revision: int = 0
    admitted: bool = False
    state: MemberState = MemberState.REGISTERED


class ChangeKind(Enum):
    ADDED = "added"
    REMOVED = "removed"
    MOVED = "moved"  # same registration, another address
    REREGISTERED = "reregistered"  # a newer incarnation of a present rank
    REGISTRATION_LOST = "registration_lost"  # its lease is gone, the rank alive: present
    RESTORED = "restored"  # registered again by the incarnation whose registration was lost


@dataclass(frozen=True)
class MembershipChange:
    """What one applied event changed; ``old`` is the member before (None when
    added); ``reason`` says why a removed rank's pending calls fail."""

    kind: ChangeKind
    rank: int
    member: Member | None
    old: Member | None
    reason: str = ""


REMOVED_REASON = "removed from the membership"
DIED_REASON = "lost, and its registration is gone"


def _always_alive(rank: int) -> bool:
    return True


class Membership:
    """The present ranks, their registrations and admission, as described above.
    ``alive(rank)`` is the client's liveness (default: every rank is alive, so a
    lost registration never removes one)."""

    def __init__(self, ranks: Iterable[int] = (), *, admit_on_join: bool = False,
                 max_members: int = 65_536,
                 alive: Callable[[int], bool] | None = None) -> None:
        if max_members < 1:
            raise ValueError("max_members must be >= 1")
        self.admit_on_join = admit_on_join
        self.max_members = max_members
        self.alive: Callable[[int], bool] = alive or _always_alive
        registered = RANK_MEMBERSHIP_TABLE.apply(MemberState.ABSENT, MemberEvent.REGISTER)
        self.members: dict[int, Member] = {r: Member(r, admitted=True, state=registered)
                                           for r in ranks}
        #: rank -> revision of its removal (bounded; oldest forgotten first)
        self.removed: dict[int, int] = {}
        #: the highest revision applied
        self.revision = 0
        self.counters: dict[str, int] = {
            "added": 0, "removed": 0, "moved": 0, "reregistered": 0, "admitted": 0,
            "registration_lost": 0, "restored": 0, "died": 0,
            "stale_revision": 0, "fenced_incarnation": 0, "refused_full": 0,
        }
        #: set by a backend that lost its source (the view is its last one), with why
        self.stale: str | None = None
        self._unadmitted = 0
        self._ranks: tuple[int, ...] = tuple(sorted(self.members))

    # -- reading -------------------------------------------------------------
    @property
    def ranks(self) -> tuple[int, ...]:
        """The present ranks, ascending."""
        return self._ranks

    @property
    def all_admitted(self) -> bool:
        return not self._unadmitted

    def __contains__(self, rank: object) -> bool:
        return rank in self.members

    def get(self, rank: int) -> Member | None:
        return self.members.get(rank)

    def state(self, rank: int) -> MemberState:
        """``rank``'s RankMembership state (ABSENT: never known here)."""
        m = self.members.get(rank)
        if m is not None:
            return m.state
        return MemberState.REMOVED if rank in self.removed else MemberState.ABSENT

    def is_admitted(self, rank: int) -> bool:
        m = self.members.get(rank)
        return m is not None and m.admitted

    def exclusion(self, rank: int, quarantine: Container[int] = (),
                  condition: Callable[[int], bool] | None = None) -> str | None:
        """Why ``rank`` is not admissible (None: it is): ``"not a member"``,
        ``"not admitted"``, ``"quarantined"`` or ``"admission condition not met"``."""
        m = self.members.get(rank)
        if m is None:
            return "not a member"
        if not m.admitted:
            return "not admitted"
        if rank in quarantine:
            return "quarantined"
        if condition is not None and not condition(rank):
            return "admission condition not met"
        return None

    def routable(self, quarantine: Container[int] = (),
                 condition: Callable[[int], bool] | None = None
                 ) -> tuple[tuple[int, ...], dict[int, str]]:
        """The admissible ranks (ascending) and, for every other present rank, why not."""
        targets: list[int] = []
        left_out: dict[int, str] = {}
        for rank in self._ranks:
            why = self.exclusion(rank, quarantine, condition)
            if why is None:
                targets.append(rank)
            else:
                left_out[rank] = why
        return tuple(targets), left_out

    def snapshot(self) -> dict[str, Any]:
        """JSON-able: the revision, each present rank's registration and admission."""
        return {"revision": self.revision, "stale": self.stale,
                "members": {r: {"address": m.address, "incarnation": m.incarnation,
                                "revision": m.revision, "admitted": m.admitted,
                                "registration": m.state.value}
                            for r, m in sorted(self.members.items())}}

    # -- changing ------------------------------------------------------------
    def admit(self, rank: int) -> bool:
        """Admit present ``rank`` (True when it was not admitted); KeyError if absent."""
        m = self.members[rank]
        if m.admitted:
            return False
        self._set(replace(m, admitted=True))
        self.counters["admitted"] += 1
        return True

    def undo_add(self, rank: int) -> None:
        """Take back the add of ``rank`` just applied (carrying it out failed: say,
        the transport refused its address). Not counted as a removal."""
        if rank in self.members:
            self._drop(rank)
            self.counters["added"] -= 1

    def apply(self, event: MembershipEvent) -> MembershipChange | None:
        """Apply one event; returns what changed, None when nothing did (stale,
        fenced, refused, or a repeat of what is known)."""
        rank = event.rank
        if type(rank) is not int:
            raise TypeError(f"a rank is an int, got {type(rank).__name__}")
        if rank < 0:
            raise ValueError(f"a rank is >= 0, got {rank}")
        if event.kind not in ("add", "update", "remove", "lost"):
            raise ValueError(f"unknown membership event kind {event.kind!r}")
        current = self.members.get(rank)
        last = current.revision if current is not None else self.removed.get(rank, 0)
        revision = event.revision or max(self.revision, last) + 1
        if revision <= last:
            self.counters["stale_revision"] += 1
            return None
        if event.kind in ("remove", "lost"):
            if current is None:
                self._note_removed(rank, revision)
                return None
            if event.incarnation and event.incarnation < current.incarnation:
                self.counters["fenced_incarnation"] += 1
                return None
            if event.kind == "remove":
                return self._leave(current, revision, MemberEvent.DEREGISTER, REMOVED_REASON)
            return self._lose_registration(current, revision)
        if current is None:
            return self._add(event, revision)
        if event.incarnation < current.incarnation:
            self.counters["fenced_incarnation"] += 1
            return None
        self.revision = max(self.revision, revision)
        state = RANK_MEMBERSHIP_TABLE.apply(current.state, MemberEvent.REGISTER)
        restored = current.state is _LOST
        if restored:
            self.counters["restored"] += 1
        if event.incarnation > current.incarnation:
            member = Member(rank, event.address, event.incarnation, revision,
                            admitted=self.admit_on_join, state=state)
            kind = ChangeKind.REREGISTERED
        elif event.address != current.address:
            member = replace(current, address=event.address, revision=revision, state=state)
            kind = ChangeKind.MOVED
        elif restored:
            member = replace(current, revision=revision, state=state)
            kind = ChangeKind.RESTORED
        else:
            self._set(replace(current, revision=revision))
            return None
        self._set(member)
        if kind is not ChangeKind.RESTORED:
            self.counters[kind.value] += 1
        return MembershipChange(kind, rank, member, current)

    def rank_died(self, rank: int) -> MembershipChange | None:
        """Liveness lost ``rank``: it leaves if its registration is lost (``REMOVED``,
        reason ``DIED_REASON``); a registered rank stays present (None)."""
        m = self.members.get(rank)
        if m is None or m.state is not _LOST:
            return None
        return self._leave(m, m.revision, MemberEvent.DIE, DIED_REASON)

    def _add(self, event: MembershipEvent, revision: int) -> MembershipChange | None:
        rank = event.rank
        if len(self.members) >= self.max_members:
            self.counters["refused_full"] += 1
            return None
        state = RANK_MEMBERSHIP_TABLE.apply(self.state(rank), MemberEvent.REGISTER)
        self.removed.pop(rank, None)
        member = Member(rank, event.address, event.incarnation, revision,
                        admitted=self.admit_on_join, state=state)
        self._set(member)
        self._ranks = tuple(sorted(self.members))
        self.revision = max(self.revision, revision)
        self.counters["added"] += 1
        return MembershipChange(ChangeKind.ADDED, rank, member, None)

    def _lose_registration(self, current: Member, revision: int) -> MembershipChange | None:
        self.revision = max(self.revision, revision)
        if current.state is _LOST:  # lost already: a repeat
            self._set(replace(current, revision=revision))
            return None
        state = RANK_MEMBERSHIP_TABLE.apply(current.state, MemberEvent.LOSE_REGISTRATION)
        lost = replace(current, revision=revision, state=state)
        self._set(lost)
        self.counters["registration_lost"] += 1
        if not self.alive(current.rank):
            return self._leave(lost, revision, MemberEvent.DIE, DIED_REASON)
        return MembershipChange(ChangeKind.REGISTRATION_LOST, current.rank, lost, current)

    def _leave(self, current: Member, revision: int, event: MemberEvent,
               reason: str) -> MembershipChange:
        RANK_MEMBERSHIP_TABLE.apply(current.state, event)  # REMOVED, or IllegalTransition
        self._drop(current.rank)
        self._note_removed(current.rank, revision)
        self.counters["removed"] += 1
        if event is MemberEvent.DIE:
            self.counters["died"] += 1
        return MembershipChange(ChangeKind.REMOVED, current.rank, None, current, reason)

    def _set(self, member: Member) -> None:
        old = self.members.get(member.rank)
        if old is not None and not old.admitted:
            self._unadmitted -= 1
        if not member.admitted:
            self._unadmitted += 1
        self.members[member.rank] = member

    def _drop(self, rank: int) -> None:
        m = self.members.pop(rank)
        if not m.admitted:
            self._unadmitted -= 1
        self._ranks = tuple(sorted(self.members))

    def _note_removed(self, rank: int, revision: int) -> None:
        self.revision = max(self.revision, revision)
        removed = self.removed
        removed.pop(rank, None)
        while len(removed) >= self.max_members:
            del removed[next(iter(removed))]
        removed[rank] = revision
