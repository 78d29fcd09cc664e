"""A caller's admission to a fan-out mailbox in queueing mode.

::

    Queued --admit--> Admitted --release--> Released
    Queued --abandon--> Abandoned

A ticket is admitted by whoever releases the previous holder (hand-off), never
by the ticket's own task resuming; that is what keeps a caller arriving in the
wake-up window from overtaking a queued one.
"""

from __future__ import annotations

from ctlwire.states.identity_enum import IdentityEnum
from ctlwire.states.transition_table import MachineSpec, StateTable, derive_table

__all__ = ["MAILBOX_TICKET", "MAILBOX_TICKET_TABLE", "TicketEvent", "TicketState"]


class TicketState(IdentityEnum):
    QUEUED = "queued"
    ADMITTED = "admitted"
    RELEASED = "released"
    ABANDONED = "abandoned"


class TicketEvent(IdentityEnum):
    ADMIT = "admit"
    RELEASE = "release"
    ABANDON = "abandon"


MAILBOX_TICKET: MachineSpec[TicketState, TicketEvent] = MachineSpec(
    name="MailboxTicket",
    states=TicketState,
    events=TicketEvent,
    initial=TicketState.QUEUED,
    transitions=(
        (TicketEvent.ADMIT, (TicketState.QUEUED,), TicketState.ADMITTED),
        (TicketEvent.RELEASE, (TicketState.ADMITTED,), TicketState.RELEASED),
        (TicketEvent.ABANDON, (TicketState.QUEUED,), TicketState.ABANDONED),
    ),
    terminal=frozenset({TicketState.RELEASED, TicketState.ABANDONED}),
    final=frozenset({TicketState.RELEASED, TicketState.ABANDONED}),
    description="a caller's admission to a queueing fan-out mailbox",
)

MAILBOX_TICKET_TABLE: StateTable[TicketState, TicketEvent] = derive_table(MAILBOX_TICKET)
