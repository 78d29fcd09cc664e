"""Which ranks belong to the fleet, and which of them may be routed to (sans-IO).

A :class:`Membership` is the client's view of the set of engine ranks, fed by
membership events from a backend (static: the ``ranks=`` a client is built
with; a store with leases and watches) or by the caller. Each event carries a
rank, an address, an incarnation (for a store: the lease of the registration)
and a revision::

    view = Membership([0, 1, 2])                     # admitted from the start
    change = view.apply(MembershipEvent("add", 3, "tcp://h:5555", incarnation=7,
                                        revision=12))
    change.kind is ChangeKind.ADDED                  # rank 3 present, not admitted
    view.admit(3)                                    # now routable

Guarantees:

* **Revisions only move forward, per rank.** An event whose revision is not
  newer than the last one applied for its rank (present or removed) is stale:
  ignored and counted (``stale_revision``). A removed rank's last revision is
  kept (a bounded number of them, oldest forgotten first), so a late ``add``
  replayed by a watch cannot bring back a rank removed after it. Events
  without a revision (``0``) take the view's next one.
* **Incarnations are fenced.** An event naming a lower incarnation than the
  present member's is ignored and counted (``fenced_incarnation``): an older
  registration never replaces a newer one. A higher incarnation is a
  re-registration (``REREGISTERED``): the member must be admitted again.
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

__all__ = ["ChangeKind", "Member", "Membership", "MembershipChange", "MembershipEvent"]


@dataclass(frozen=True)
class MembershipEvent:
    """What a membership backend reports: ``kind`` ``"add"``/``"update"`` (the rank
    is registered with this address and incarnation: an upsert) or ``"remove"``;
    ``revision`` orders the events of one rank (0: the view's next)."""

    kind: Literal["add", "update", "remove"]
    rank: int
    address: str = ""
    incarnation: int = 0
    revision: int = 0


@dataclass(frozen=True)
class Member:
    """A present rank: where it is, which registration, and whether it is admitted."""

    rank: int
    address: str = ""
    incarnation: int = 0
    revision: int = 0
    admitted: bool = False


class ChangeKind(Enum):
    ADDED = "added"
    REMOVED = "removed"
    MOVED = "moved"  # same registration, another address
    REREGISTERED = "reregistered"  # a newer incarnation of a present rank


@dataclass(frozen=True)
class MembershipChange:
    """What one applied event changed; ``old`` is the member before (None when added)."""

    kind: ChangeKind
    rank: int
    member: Member | None
    old: Member | None


class Membership:
    """The present ranks, their registrations and admission, as described above."""

    def __init__(self, ranks: Iterable[int] = (), *, admit_on_join: bool = False,
                 max_members: int = 65_536) -> None:
        if max_members < 1:
            raise ValueError("max_members must be >= 1")
        self.admit_on_join = admit_on_join
        self.max_members = max_members
        self.members: dict[int, Member] = {r: Member(r, admitted=True) for r in ranks}
        #: rank -> revision of its removal (bounded; oldest forgotten first)
        self.removed: dict[int, int] = {}
        #: the highest revision applied
        self.revision = 0
        self.counters: dict[str, int] = {
            "added": 0, "removed": 0, "moved": 0, "reregistered": 0, "admitted": 0,
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
                                "revision": m.revision, "admitted": m.admitted}
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
        if event.kind not in ("add", "update", "remove"):
            raise ValueError(f"unknown membership event kind {event.kind!r}")
        current = self.members.get(rank)
        last = current.revision if current is not None else self.removed.get(rank, 0)
        revision = event.revision or max(self.revision, last) + 1
        if revision <= last:
            self.counters["stale_revision"] += 1
            return None
        if event.kind == "remove":
            self._note_removed(rank, revision)
            if current is None:
                return None
            self._drop(rank)
            self.counters["removed"] += 1
            return MembershipChange(ChangeKind.REMOVED, rank, None, current)
        if current is None:
            if len(self.members) >= self.max_members:
                self.counters["refused_full"] += 1
                return None
            self.removed.pop(rank, None)
            member = Member(rank, event.address, event.incarnation, revision,
                            admitted=self.admit_on_join)
            self._set(member)
            self._ranks = tuple(sorted(self.members))
            self.revision = max(self.revision, revision)
            self.counters["added"] += 1
            return MembershipChange(ChangeKind.ADDED, rank, member, None)
        if event.incarnation < current.incarnation:
            self.counters["fenced_incarnation"] += 1
            return None
        self.revision = max(self.revision, revision)
        if event.incarnation > current.incarnation:
            member = Member(rank, event.address, event.incarnation, revision,
                            admitted=self.admit_on_join)
            kind = ChangeKind.REREGISTERED
        elif event.address != current.address:
            member = replace(current, address=event.address, revision=revision)
            kind = ChangeKind.MOVED
        else:
            self._set(replace(current, revision=revision))
            return None
        self._set(member)
        self.counters[kind.value] += 1
        return MembershipChange(kind, rank, member, current)

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
