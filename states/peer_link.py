"""An engine rank as the client sees it.

::

    Unknown --seen--> Connected --miss--> Suspect --miss--> Suspect
    Connected | Suspect --seen--> Connected
    Connected | Suspect --lose--> Lost   (missed too many heartbeats, or disconnected)
    Lost --rejoin--> Connected           (heard from again, possibly a new incarnation)

Counting misses is the driver's job (the machine has no counters): it applies
``lose`` once a peer has missed its limit. A new engine incarnation seen while
Connected is a ``lose`` followed by a ``rejoin``: the old incarnation's pending
requests are failed before the new one is served.
"""

from __future__ import annotations

from ctlwire.states.identity_enum import IdentityEnum
from ctlwire.states.transition_table import MachineSpec, StateTable, derive_table

__all__ = ["PEER_LINK", "PEER_LINK_TABLE", "PeerEvent", "PeerState"]


class PeerState(IdentityEnum):
    UNKNOWN = "unknown"
    CONNECTED = "connected"
    SUSPECT = "suspect"
    LOST = "lost"


class PeerEvent(IdentityEnum):
    SEEN = "seen"
    MISS = "miss"
    LOSE = "lose"
    REJOIN = "rejoin"


_P = PeerState
PEER_LINK: MachineSpec[PeerState, PeerEvent] = MachineSpec(
    name="PeerLink",
    states=PeerState,
    events=PeerEvent,
    initial=_P.UNKNOWN,
    transitions=(
        (PeerEvent.SEEN, (_P.UNKNOWN, _P.CONNECTED, _P.SUSPECT), _P.CONNECTED),
        (PeerEvent.MISS, (_P.CONNECTED, _P.SUSPECT), _P.SUSPECT),
        (PeerEvent.LOSE, (_P.CONNECTED, _P.SUSPECT), _P.LOST),
        (PeerEvent.REJOIN, (_P.LOST,), _P.CONNECTED),
    ),
    terminal=frozenset({_P.LOST}),
    final=frozenset(),
    description="an engine rank as the client sees it",
)

PEER_LINK_TABLE: StateTable[PeerState, PeerEvent] = derive_table(PEER_LINK)
