"""The API-side lifecycle of one control request (to one rank or many).

::

    Registered --send--> Sent --wait--> Awaiting
    Sent | Awaiting --complete--> Done          (a reply may beat the wait)
    Registered | Sent | Awaiting --expire--> TimedOut
    Registered | Sent | Awaiting --fail--> Failed      (unroutable, engine dead)
    Registered | Sent | Awaiting --cancel--> Cancelled (caller went away)
    Done | TimedOut | Failed | Cancelled --clean--> Cleaned

``complete`` is legal from ``Sent``: an engine may answer before the caller
reaches its wait, and that is not an error (FastDeploy hung on exactly that).
``Cleaned`` is reachable from every terminal state and only from them; it is
the state in which the request-map entry no longer exists.
"""

from __future__ import annotations

from ctlwire.states.identity_enum import IdentityEnum
from ctlwire.states.transition_table import MachineSpec, StateTable, derive_table

__all__ = ["CONTROL_REQUEST", "CONTROL_REQUEST_TABLE", "RequestEvent", "RequestState"]


class RequestState(IdentityEnum):
    REGISTERED = "registered"
    SENT = "sent"
    AWAITING = "awaiting"
    DONE = "done"
    TIMED_OUT = "timed_out"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CLEANED = "cleaned"


class RequestEvent(IdentityEnum):
    SEND = "send"
    WAIT = "wait"
    COMPLETE = "complete"
    EXPIRE = "expire"
    FAIL = "fail"
    CANCEL = "cancel"
    CLEAN = "clean"


_S = RequestState
_E = RequestEvent
_OPEN = (_S.REGISTERED, _S.SENT, _S.AWAITING)

CONTROL_REQUEST: MachineSpec[RequestState, RequestEvent] = MachineSpec(
    name="ControlRequest",
    states=RequestState,
    events=RequestEvent,
    initial=_S.REGISTERED,
    transitions=(
        (_E.SEND, (_S.REGISTERED,), _S.SENT),
        (_E.WAIT, (_S.SENT,), _S.AWAITING),
        (_E.COMPLETE, (_S.SENT, _S.AWAITING), _S.DONE),
        (_E.EXPIRE, _OPEN, _S.TIMED_OUT),
        (_E.FAIL, _OPEN, _S.FAILED),
        (_E.CANCEL, _OPEN, _S.CANCELLED),
        (_E.CLEAN, (_S.DONE, _S.TIMED_OUT, _S.FAILED, _S.CANCELLED), _S.CLEANED),
    ),
    terminal=frozenset({_S.DONE, _S.TIMED_OUT, _S.FAILED, _S.CANCELLED}),
    final=frozenset({_S.CLEANED}),
    cleanup=_S.CLEANED,
    description="API side: one control request to one rank or many",
)

CONTROL_REQUEST_TABLE: StateTable[RequestState, RequestEvent] = derive_table(CONTROL_REQUEST)
