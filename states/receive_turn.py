"""Whose turn it is to receive on a client's transport: its receive loop, or a caller.

::

    Idle --loop_receives--> Loop --loop_received--> Idle
    Idle --caller_takes--> Caller --caller_received--> HandingOn --caller_handed_on--> Caller
    Caller --caller_gives_back--> Idle
    Loop | Caller --transport_closed--> Closed --caller_gives_back--> Closed

One task receives at a time. A caller takes the turn only when no one receives
(``Idle``): it then hands on every event it receives, as the loop would, until its
own request is decided, and gives the turn back; the loop does not receive
meanwhile. A decision of the caller's request ends its receive only while it waits
for the transport (``Caller``), never while it hands on the events that decided it
(``HandingOn``). Once a receiver saw the transport close, no one receives again.
"""

from __future__ import annotations

from ctlwire.states.identity_enum import IdentityEnum
from ctlwire.states.transition_table import MachineSpec, StateTable, derive_table

__all__ = ["RECEIVE_TURN", "RECEIVE_TURN_TABLE", "TurnEvent", "TurnState"]


class TurnState(IdentityEnum):
    IDLE = "idle"
    LOOP = "loop"
    CALLER = "caller"
    HANDING_ON = "handing_on"
    CLOSED = "closed"


class TurnEvent(IdentityEnum):
    LOOP_RECEIVES = "loop_receives"
    LOOP_RECEIVED = "loop_received"
    CALLER_TAKES = "caller_takes"
    CALLER_RECEIVED = "caller_received"
    CALLER_HANDED_ON = "caller_handed_on"
    CALLER_GIVES_BACK = "caller_gives_back"
    TRANSPORT_CLOSED = "transport_closed"


_S = TurnState
_E = TurnEvent

RECEIVE_TURN: MachineSpec[TurnState, TurnEvent] = MachineSpec(
    name="ReceiveTurn",
    states=TurnState,
    events=TurnEvent,
    initial=_S.IDLE,
    transitions=(
        (_E.LOOP_RECEIVES, (_S.IDLE,), _S.LOOP),
        (_E.LOOP_RECEIVED, (_S.LOOP,), _S.IDLE),
        (_E.CALLER_TAKES, (_S.IDLE,), _S.CALLER),
        (_E.CALLER_RECEIVED, (_S.CALLER,), _S.HANDING_ON),
        (_E.CALLER_HANDED_ON, (_S.HANDING_ON,), _S.CALLER),
        (_E.CALLER_GIVES_BACK, (_S.CALLER,), _S.IDLE),
        (_E.CALLER_GIVES_BACK, (_S.CLOSED,), _S.CLOSED),
        (_E.TRANSPORT_CLOSED, (_S.LOOP, _S.CALLER), _S.CLOSED),
    ),
    terminal=frozenset({_S.CLOSED}),
    final=frozenset(),
    description="client side: whose turn it is to receive, the receive loop's or a caller's",
)

RECEIVE_TURN_TABLE: StateTable[TurnState, TurnEvent] = derive_table(RECEIVE_TURN)
