"""The engine-side lifecycle of one received control request.

::

    Received --start--> Running --reply--> Replied
    Received --reject--> Rejected   (unknown method, bad payload)
    Received --expire--> Expired    (its deadline passed before it could run)

A rejected or expired request is never run; each still gets a typed error reply.
A handler that raises is ``Replied`` with an error reply.
"""

from __future__ import annotations

from ctlwire.states.identity_enum import IdentityEnum
from ctlwire.states.transition_table import MachineSpec, StateTable, derive_table

__all__ = ["INBOUND_REQUEST", "INBOUND_REQUEST_TABLE", "InboundEvent", "InboundState"]


class InboundState(IdentityEnum):
    RECEIVED = "received"
    RUNNING = "running"
    REPLIED = "replied"
    REJECTED = "rejected"
    EXPIRED = "expired"


class InboundEvent(IdentityEnum):
    START = "start"
    REPLY = "reply"
    REJECT = "reject"
    EXPIRE = "expire"


_I = InboundState
INBOUND_REQUEST: MachineSpec[InboundState, InboundEvent] = MachineSpec(
    name="InboundRequest",
    states=InboundState,
    events=InboundEvent,
    initial=_I.RECEIVED,
    transitions=(
        (InboundEvent.START, (_I.RECEIVED,), _I.RUNNING),
        (InboundEvent.REPLY, (_I.RUNNING,), _I.REPLIED),
        (InboundEvent.REJECT, (_I.RECEIVED,), _I.REJECTED),
        (InboundEvent.EXPIRE, (_I.RECEIVED,), _I.EXPIRED),
    ),
    terminal=frozenset({_I.REPLIED, _I.REJECTED, _I.EXPIRED}),
    final=frozenset({_I.REPLIED, _I.REJECTED, _I.EXPIRED}),
    description="engine side: one received control request",
)

INBOUND_REQUEST_TABLE: StateTable[InboundState, InboundEvent] = derive_table(INBOUND_REQUEST)
