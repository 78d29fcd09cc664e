"""An engine rank as the client sees it: is it there (liveness), is it moving (progress).

::

    Unknown --idle--> Connected            (heard from, not running anything)
    any live --work--> Busy                (running a request or a step, within its stall limit)
    any live --stall--> Stalled            (alive, but no progress for longer than the limit)
    any live --idle--> Connected
    any live --miss--> Suspect --miss--> Suspect
    any live --lose--> Lost                (missed too many heartbeats, or disconnected)
    Lost --rejoin--> Connected             (heard from again by its admitted incarnation)

"Live" is Connected, Busy, Stalled or Suspect. Liveness (heartbeats, which an
engine sends from a thread of its own, so a handler or step blocking for
minutes does not silence them) and progress (what the heartbeat says the
engine is running, and for how long) are separate signals: Busy and Stalled
ranks are alive, and their pending calls wait for their own deadlines;
whether a stall fails calls is the caller's policy, never a side effect of
this machine. Only Lost fails pending calls.

Counting misses and judging stalls is the driver's job (the machine has no
counters or clocks): it applies ``lose`` once a peer has missed its limit,
``stall`` once a heartbeat reports work running past its stall limit. A new
engine incarnation seen while live is a ``lose`` followed by a ``rejoin``:
the old incarnation's pending requests are failed before the new one is served.
"""

from __future__ import annotations

from ctlwire.states.identity_enum import IdentityEnum
from ctlwire.states.transition_table import MachineSpec, StateTable, derive_table

__all__ = ["LIVE_PEER_STATES", "PEER_LINK", "PEER_LINK_TABLE", "PeerEvent", "PeerState"]


class PeerState(IdentityEnum):
    UNKNOWN = "unknown"
    CONNECTED = "connected"
    BUSY = "busy"
    STALLED = "stalled"
    SUSPECT = "suspect"
    LOST = "lost"


class PeerEvent(IdentityEnum):
    IDLE = "idle"
    WORK = "work"
    STALL = "stall"
    MISS = "miss"
    LOSE = "lose"
    REJOIN = "rejoin"


_P = PeerState
_LIVE = (_P.CONNECTED, _P.BUSY, _P.STALLED, _P.SUSPECT)
LIVE_PEER_STATES: frozenset[PeerState] = frozenset(_LIVE)
"""States in which a rank is there (its calls are sent and wait for their deadlines)."""

PEER_LINK: MachineSpec[PeerState, PeerEvent] = MachineSpec(
    name="PeerLink",
    states=PeerState,
    events=PeerEvent,
    initial=_P.UNKNOWN,
    transitions=(
        (PeerEvent.IDLE, (_P.UNKNOWN, *_LIVE), _P.CONNECTED),
        (PeerEvent.WORK, (_P.UNKNOWN, *_LIVE), _P.BUSY),
        (PeerEvent.STALL, (_P.UNKNOWN, *_LIVE), _P.STALLED),
        (PeerEvent.MISS, _LIVE, _P.SUSPECT),
        (PeerEvent.LOSE, _LIVE, _P.LOST),
        (PeerEvent.REJOIN, (_P.LOST,), _P.CONNECTED),
    ),
    terminal=frozenset({_P.LOST}),
    final=frozenset(),
    description="an engine rank as the client sees it: liveness and progress",
)

PEER_LINK_TABLE: StateTable[PeerState, PeerEvent] = derive_table(PEER_LINK)
