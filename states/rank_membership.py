"""An engine rank's place in the fleet as the client sees it: should it be there?

::

    Absent --register--> Registered                (the store lists it: present)
    Registered --register--> Registered            (renewed, moved, or a newer incarnation)
    Registered --lose_registration--> RegistrationLost
                                                   (its registration vanished by lease loss
                                                    while the rank is alive: still present)
    RegistrationLost --register--> Registered      (registered again, same incarnation or newer)
    Registered, RegistrationLost --deregister--> Removed
                                                   (an explicit removal: an operator deleted
                                                    it, or the engine deregistered)
    RegistrationLost --die--> Removed              (lost by liveness, and unregistered)
    Removed --register--> Registered               (it joins again)

Two signals are kept apart. The store (a registration under a lease) says who
*should* be in the fleet; the rank's own heartbeats (the ``PeerLink`` machine)
say who is *alive*. A lease can expire while its rank lives — the store froze,
lost its leader, or could not be reached — so a vanished registration is never
a death by itself: a rank that is alive stays present (``RegistrationLost``)
until it registers again. Only ``deregister`` (an explicit removal) and ``die``
(a rank whose registration is lost is also lost by liveness) make a rank leave;
those are the only ways membership fails a rank's pending calls. A rank that is
registered but dead stays present: the store says it should be there, and its
calls fail by liveness (``PeerLink`` Lost), not by membership.

Whether a vanished registration was an explicit removal or a lease loss, and
whether the rank is alive, is the driver's to find out; the machine only says
where each answer leads.
"""

from __future__ import annotations

from ctlwire.states.identity_enum import IdentityEnum
from ctlwire.states.transition_table import MachineSpec, StateTable, derive_table

__all__ = ["PRESENT_MEMBER_STATES", "RANK_MEMBERSHIP", "RANK_MEMBERSHIP_TABLE", "MemberEvent",
           "MemberState"]


class MemberState(IdentityEnum):
    ABSENT = "absent"
    REGISTERED = "registered"
    REGISTRATION_LOST = "registration_lost"
    REMOVED = "removed"


class MemberEvent(IdentityEnum):
    REGISTER = "register"
    LOSE_REGISTRATION = "lose_registration"
    DEREGISTER = "deregister"
    DIE = "die"


_M = MemberState
PRESENT_MEMBER_STATES: frozenset[MemberState] = frozenset({_M.REGISTERED, _M.REGISTRATION_LOST})
"""States in which a rank is in the client's view (routed to when admitted)."""

RANK_MEMBERSHIP: MachineSpec[MemberState, MemberEvent] = MachineSpec(
    name="RankMembership",
    states=MemberState,
    events=MemberEvent,
    initial=_M.ABSENT,
    transitions=(
        (MemberEvent.REGISTER, (_M.ABSENT, _M.REGISTERED, _M.REGISTRATION_LOST, _M.REMOVED),
         _M.REGISTERED),
        (MemberEvent.LOSE_REGISTRATION, (_M.REGISTERED,), _M.REGISTRATION_LOST),
        (MemberEvent.DEREGISTER, (_M.REGISTERED, _M.REGISTRATION_LOST), _M.REMOVED),
        (MemberEvent.DIE, (_M.REGISTRATION_LOST,), _M.REMOVED),
    ),
    terminal=frozenset({_M.REMOVED}),
    final=frozenset(),
    description="an engine rank's membership as the client sees it: the store says "
                "who should be there, heartbeats who is alive",
)

RANK_MEMBERSHIP_TABLE: StateTable[MemberState, MemberEvent] = derive_table(RANK_MEMBERSHIP)
