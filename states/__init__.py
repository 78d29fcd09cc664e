"""Pure, synchronous state machines of ctlwire.

Each machine is declared once with transitions (:mod:`ctlwire.states.control_request`,
:mod:`~ctlwire.states.mailbox_ticket`, :mod:`~ctlwire.states.peer_link`,
:mod:`~ctlwire.states.inbound_request`, :mod:`~ctlwire.states.operation`); an
immutable ``(state, event) -> state`` table is derived from each at import and is
what the kernel drives. Nothing in this package does IO, reads a clock, or
imports anyio, zmq, the kernel or the transports.
"""

from __future__ import annotations

from typing import Any

from ctlwire.states.control_request import (
    CONTROL_REQUEST,
    CONTROL_REQUEST_TABLE,
    RequestEvent,
    RequestState,
)
from ctlwire.states.errors import IllegalTransition
from ctlwire.states.inbound_request import (
    INBOUND_REQUEST,
    INBOUND_REQUEST_TABLE,
    InboundEvent,
    InboundState,
)
from ctlwire.states.mailbox_ticket import (
    MAILBOX_TICKET,
    MAILBOX_TICKET_TABLE,
    TicketEvent,
    TicketState,
)
from ctlwire.states.operation import (
    OPERATION,
    OPERATION_RANK,
    OPERATION_RANK_TABLE,
    OPERATION_TABLE,
    OperationEvent,
    OperationState,
    RankEvent,
    RankState,
)
from ctlwire.states.peer_link import (
    LIVE_PEER_STATES,
    PEER_LINK,
    PEER_LINK_TABLE,
    PeerEvent,
    PeerState,
)
from ctlwire.states.transition_table import MachineSpec, StateTable, build_machine, derive_table

MACHINES: tuple[MachineSpec[Any, Any], ...] = (
    CONTROL_REQUEST,
    MAILBOX_TICKET,
    PEER_LINK,
    INBOUND_REQUEST,
    OPERATION,
    OPERATION_RANK,
)
TABLES: tuple[StateTable[Any, Any], ...] = (
    CONTROL_REQUEST_TABLE,
    MAILBOX_TICKET_TABLE,
    PEER_LINK_TABLE,
    INBOUND_REQUEST_TABLE,
    OPERATION_TABLE,
    OPERATION_RANK_TABLE,
)

__all__ = [
    "CONTROL_REQUEST",
    "CONTROL_REQUEST_TABLE",
    "INBOUND_REQUEST",
    "INBOUND_REQUEST_TABLE",
    "LIVE_PEER_STATES",
    "MACHINES",
    "MAILBOX_TICKET",
    "MAILBOX_TICKET_TABLE",
    "OPERATION",
    "OPERATION_RANK",
    "OPERATION_RANK_TABLE",
    "OPERATION_TABLE",
    "PEER_LINK",
    "PEER_LINK_TABLE",
    "TABLES",
    "IllegalTransition",
    "InboundEvent",
    "InboundState",
    "MachineSpec",
    "OperationEvent",
    "OperationState",
    "PeerEvent",
    "PeerState",
    "RankEvent",
    "RankState",
    "RequestEvent",
    "RequestState",
    "StateTable",
    "TicketEvent",
    "TicketState",
    "build_machine",
    "derive_table",
]
