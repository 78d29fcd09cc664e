"""The membership view (sans-IO): revisions, incarnations, admission, bounds, a lost
registration kept apart from a removal; and the peer table's side of ranks that come
and go."""

from __future__ import annotations

import pytest

from ctlwire.kernel.core.membership import (
    DIED_REASON,
    REMOVED_REASON,
    ChangeKind,
    Membership,
    MembershipEvent,
)
from ctlwire.kernel.core.peer_table import PeerTable
from ctlwire.states import MemberState, PeerState


def test_initial_ranks_are_present_and_admitted_joining_ones_are_not() -> None:
    view = Membership([0, 1])
    assert view.ranks == (0, 1) and view.all_admitted
    change = view.apply(MembershipEvent("add", 2, "tcp://h:1", incarnation=5, revision=3))
    assert change is not None and change.kind is ChangeKind.ADDED
    assert view.ranks == (0, 1, 2) and not view.all_admitted
    assert view.routable() == ((0, 1), {2: "not admitted"})
    assert view.admit(2) and not view.admit(2)
    assert view.routable() == ((0, 1, 2), {}) and view.all_admitted
    assert Membership([0], admit_on_join=True).apply(
        MembershipEvent("add", 1)).member.admitted  # type: ignore[union-attr]


def test_stale_revisions_are_ignored_and_counted() -> None:
    view = Membership()
    view.apply(MembershipEvent("add", 4, "a", 1, revision=10))
    assert view.apply(MembershipEvent("update", 4, "b", 1, revision=10)) is None
    assert view.apply(MembershipEvent("update", 4, "b", 1, revision=9)) is None
    assert view.counters["stale_revision"] == 2 and view.get(4).address == "a"  # type: ignore[union-attr]
    removed = view.apply(MembershipEvent("remove", 4, revision=12))
    assert removed is not None and removed.kind is ChangeKind.REMOVED and 4 not in view
    # a watch replaying the older add cannot bring the removed rank back
    assert view.apply(MembershipEvent("add", 4, "a", 1, revision=11)) is None
    assert 4 not in view and view.counters["stale_revision"] == 3
    again = view.apply(MembershipEvent("add", 4, "c", 2, revision=13))
    assert again is not None and again.kind is ChangeKind.ADDED and view.revision == 13
    # events without a revision take the next one
    assert view.apply(MembershipEvent("add", 5)) is not None
    assert view.get(5).revision == 14  # type: ignore[union-attr]


def test_incarnations_are_fenced_and_reregistration_needs_admission_again() -> None:
    view = Membership()
    view.apply(MembershipEvent("add", 1, "a", incarnation=7, revision=1))
    view.admit(1)
    moved = view.apply(MembershipEvent("update", 1, "b", incarnation=7, revision=2))
    assert moved is not None and moved.kind is ChangeKind.MOVED
    assert view.is_admitted(1) and view.get(1).address == "b"  # type: ignore[union-attr]
    assert view.apply(MembershipEvent("update", 1, "c", incarnation=6, revision=3)) is None
    assert view.counters["fenced_incarnation"] == 1
    again = view.apply(MembershipEvent("add", 1, "b", incarnation=8, revision=4))
    assert again is not None and again.kind is ChangeKind.REREGISTERED
    assert not view.is_admitted(1) and view.exclusion(1) == "not admitted"
    # a repeat of what is known changes nothing, but its revision is taken
    assert view.apply(MembershipEvent("update", 1, "b", incarnation=8, revision=5)) is None
    assert view.get(1).revision == 5  # type: ignore[union-attr]


def test_exclusion_says_why_a_present_rank_is_not_admissible() -> None:
    view = Membership([0, 1, 2, 3])
    view.apply(MembershipEvent("remove", 3))
    view.apply(MembershipEvent("add", 3, incarnation=1))
    targets, left_out = view.routable(quarantine={1}, condition=lambda r: r != 2)
    assert targets == (0,)
    assert left_out == {1: "quarantined", 2: "admission condition not met",
                        3: "not admitted"}
    assert view.exclusion(9) == "not a member"


def test_membership_is_bounded_and_refuses_bad_events() -> None:
    view = Membership([0, 1], max_members=2)
    assert view.apply(MembershipEvent("add", 2)) is None
    assert view.counters["refused_full"] == 1 and view.ranks == (0, 1)
    for rank in (0, 1):
        view.apply(MembershipEvent("remove", rank))
    for rank in range(10, 20):
        view.apply(MembershipEvent("remove", rank))
    assert len(view.removed) <= 2
    with pytest.raises(TypeError):
        view.apply(MembershipEvent("add", "3"))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        view.apply(MembershipEvent("join", 3))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        view.apply(MembershipEvent("add", -1))


def test_peer_table_forgets_a_removed_rank_but_keeps_it_fenced() -> None:
    table = PeerTable([0, 1], interval=1.0)
    table.seen(1, 200, 0.0)
    assert table.state(1) is PeerState.CONNECTED
    assert table.remove(1) and not table.remove(1)
    assert table.is_lost(1)  # nothing may be sent to a removed rank
    table.seen(1, 200, 0.1)
    assert table.foreign == 1 and 1 not in table.live_ranks()
    assert table.add(1) and not table.add(1) and not table.is_lost(1)
    assert table.state(1) is PeerState.UNKNOWN
    # an older incarnation stays fenced; the same or a newer one is first contact
    table.seen(1, 100, 0.2)
    assert table.fenced == 1 and table.state(1) is PeerState.UNKNOWN
    assert not table.is_stale(1, 300) and table.is_stale(1, 100)
    assert table.seen(1, 300, 0.3) == []
    assert table.state(1) is PeerState.CONNECTED and table.peers[1].incarnation == 300


def test_a_lost_registration_keeps_a_live_rank_present_admitted_and_restorable() -> None:
    alive = {1: True, 2: True}
    view = Membership([1, 2], alive=lambda r: alive[r])
    view.apply(MembershipEvent("add", 1, "a", incarnation=7, revision=3))
    assert view.admit(1) and view.state(1) is MemberState.REGISTERED
    lost = view.apply(MembershipEvent("lost", 1, incarnation=7, revision=4))
    assert lost is not None and lost.kind is ChangeKind.REGISTRATION_LOST
    assert view.state(1) is MemberState.REGISTRATION_LOST
    # still present, admitted and routed to
    assert view.routable() == ((1, 2), {}) and view.ranks == (1, 2)
    assert view.apply(MembershipEvent("lost", 1, incarnation=7, revision=5)) is None  # a repeat
    # registered again by the same incarnation: restored, admission kept
    back = view.apply(MembershipEvent("add", 1, "a", incarnation=7, revision=6))
    assert back is not None and back.kind is ChangeKind.RESTORED
    assert view.state(1) is MemberState.REGISTERED and view.is_admitted(1)
    # a lost registration's rank that is lost by liveness leaves; a registered one stays
    view.apply(MembershipEvent("lost", 1, incarnation=7, revision=7))
    assert view.rank_died(2) is None and 2 in view
    alive[1] = False
    died = view.rank_died(1)
    assert died is not None and died.kind is ChangeKind.REMOVED and died.reason == DIED_REASON
    assert 1 not in view and view.state(1) is MemberState.REMOVED
    assert view.rank_died(1) is None
    assert (view.counters["registration_lost"], view.counters["restored"],
            view.counters["died"], view.counters["removed"]) == (2, 1, 1, 1)
    # a replay of its older registration cannot bring it back; a newer one can
    assert view.apply(MembershipEvent("add", 1, "a", incarnation=7, revision=6)) is None
    again = view.apply(MembershipEvent("add", 1, "a", incarnation=8, revision=9))
    assert again is not None and again.kind is ChangeKind.ADDED and not view.is_admitted(1)


def test_a_lost_registration_of_a_dead_rank_removes_it_and_a_deletion_always_does() -> None:
    view = Membership([0, 1, 2], alive=lambda r: r != 0)
    gone = view.apply(MembershipEvent("lost", 0, revision=2))
    assert gone is not None and gone.kind is ChangeKind.REMOVED and gone.reason == DIED_REASON
    removed = view.apply(MembershipEvent("remove", 1, revision=3))
    assert removed is not None and removed.reason == REMOVED_REASON
    view.apply(MembershipEvent("lost", 2, revision=4))
    assert view.state(2) is MemberState.REGISTRATION_LOST
    removed = view.apply(MembershipEvent("remove", 2, revision=5))  # a lost one, deleted
    assert removed is not None and removed.kind is ChangeKind.REMOVED
    assert view.ranks == () and view.counters["died"] == 1
    assert view.state(9) is MemberState.ABSENT


def test_a_deletion_or_loss_of_an_older_incarnation_is_fenced() -> None:
    view = Membership()
    view.apply(MembershipEvent("add", 3, "new", incarnation=20, revision=5))
    # the old process's registration, deleted or expired, says nothing of the new one
    assert view.apply(MembershipEvent("remove", 3, incarnation=10, revision=6)) is None
    assert view.apply(MembershipEvent("lost", 3, incarnation=10, revision=7)) is None
    assert view.counters["fenced_incarnation"] == 2 and view.state(3) is MemberState.REGISTERED
    # without an incarnation, it is the present registration's
    assert view.apply(MembershipEvent("lost", 3, revision=8)) is not None
    # a lost and restored rank that comes back as a newer process must be admitted again
    view.admit(3)
    change = view.apply(MembershipEvent("add", 3, "new", incarnation=21, revision=9))
    assert change is not None and change.kind is ChangeKind.REREGISTERED
    assert view.state(3) is MemberState.REGISTERED and not view.is_admitted(3)
    assert view.snapshot()["members"][3]["registration"] == "registered"
