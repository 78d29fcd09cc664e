"""A caller's admission to a fan-out mailbox in queueing mode.

::

    Queued --admit--> Admitted --start--> Started --decide--> Decided --release--> Released
    Queued --abandon--> Abandoned
    Admitted --decide--> Decided
    Admitted, Started --release--> Released

A ticket is admitted by whoever frees the slot or the turn it waits for
(hand-off), never by the ticket's own task resuming; that is what keeps a
caller arriving in the wake-up window from overtaking a queued one.

*Admitted*: its caller holds a slot and its turn to start (a client's holder
hands its frames over); at most one ticket of a mailbox is Admitted, so holders
start in admission order. *Started*: it holds a slot, its work in flight.
*Decided*: its work is decided and its slot passed on; it keeps its place in
the order in which holders leave. A decision implies the start.
"""

from __future__ import annotations

from ctlwire.states.identity_enum import IdentityEnum
from ctlwire.states.transition_table import MachineSpec, StateTable, derive_table

__all__ = ["MAILBOX_TICKET", "MAILBOX_TICKET_TABLE", "TicketEvent", "TicketState"]


class TicketState(IdentityEnum):
    QUEUED = "queued"
    ADMITTED = "admitted"
    STARTED = "started"
    DECIDED = "decided"
    RELEASED = "released"
    ABANDONED = "abandoned"


class TicketEvent(IdentityEnum):
    ADMIT = "admit"
    START = "start"
    DECIDE = "decide"
    RELEASE = "release"
    ABANDON = "abandon"


MAILBOX_TICKET: MachineSpec[TicketState, TicketEvent] = MachineSpec(
    name="MailboxTicket",
    states=TicketState,
    events=TicketEvent,
    initial=TicketState.QUEUED,
    transitions=(
        (TicketEvent.ADMIT, (TicketState.QUEUED,), TicketState.ADMITTED),
        (TicketEvent.START, (TicketState.ADMITTED,), TicketState.STARTED),
        (TicketEvent.DECIDE, (TicketState.ADMITTED, TicketState.STARTED), TicketState.DECIDED),
        (TicketEvent.RELEASE, (TicketState.ADMITTED, TicketState.STARTED, TicketState.DECIDED),
         TicketState.RELEASED),
        (TicketEvent.ABANDON, (TicketState.QUEUED,), TicketState.ABANDONED),
    ),
    terminal=frozenset({TicketState.RELEASED, TicketState.ABANDONED}),
    final=frozenset({TicketState.RELEASED, TicketState.ABANDONED}),
    description="a caller's admission to a queueing fan-out mailbox",
)

MAILBOX_TICKET_TABLE: StateTable[TicketState, TicketEvent] = derive_table(MAILBOX_TICKET)
