"""Pure, synchronous state machines of ctlwire.

Each machine is declared once with transitions (:mod:`ctlwire.states.control_request`,
:mod:`~ctlwire.states.mailbox_ticket`, :mod:`~ctlwire.states.peer_link`,
:mod:`~ctlwire.states.rank_membership`,
:mod:`~ctlwire.states.inbound_request`, :mod:`~ctlwire.states.operation`,
:mod:`~ctlwire.states.receive_turn`); an
immutable ``(state, event) -> state`` table is derived from each at import and is
what the kernel drives. Nothing in this package does IO, reads a clock, or
imports anyio, zmq, the kernel or the transports.
"""

import types

from ctlwire.states.control_request import CONTROL_REQUEST as CONTROL_REQUEST
from ctlwire.states.control_request import CONTROL_REQUEST_TABLE as CONTROL_REQUEST_TABLE
from ctlwire.states.control_request import RequestEvent as RequestEvent
from ctlwire.states.control_request import RequestState as RequestState
from ctlwire.states.errors import IllegalTransition as IllegalTransition
from ctlwire.states.inbound_request import INBOUND_REQUEST as INBOUND_REQUEST
from ctlwire.states.inbound_request import INBOUND_REQUEST_TABLE as INBOUND_REQUEST_TABLE
from ctlwire.states.inbound_request import InboundEvent as InboundEvent
from ctlwire.states.inbound_request import InboundState as InboundState
from ctlwire.states.mailbox_ticket import MAILBOX_TICKET as MAILBOX_TICKET
from ctlwire.states.mailbox_ticket import MAILBOX_TICKET_TABLE as MAILBOX_TICKET_TABLE
from ctlwire.states.mailbox_ticket import TicketEvent as TicketEvent
from ctlwire.states.mailbox_ticket import TicketState as TicketState
from ctlwire.states.operation import OPERATION as OPERATION
from ctlwire.states.operation import OPERATION_RANK as OPERATION_RANK
from ctlwire.states.operation import OPERATION_RANK_TABLE as OPERATION_RANK_TABLE
from ctlwire.states.operation import OPERATION_TABLE as OPERATION_TABLE
from ctlwire.states.operation import OperationEvent as OperationEvent
from ctlwire.states.operation import OperationState as OperationState
from ctlwire.states.operation import RankEvent as RankEvent
from ctlwire.states.operation import RankState as RankState
from ctlwire.states.peer_link import LIVE_PEER_STATES as LIVE_PEER_STATES
from ctlwire.states.peer_link import PEER_LINK as PEER_LINK
from ctlwire.states.peer_link import PEER_LINK_TABLE as PEER_LINK_TABLE
from ctlwire.states.peer_link import PeerEvent as PeerEvent
from ctlwire.states.peer_link import PeerState as PeerState
from ctlwire.states.rank_membership import PRESENT_MEMBER_STATES as PRESENT_MEMBER_STATES
from ctlwire.states.rank_membership import RANK_MEMBERSHIP as RANK_MEMBERSHIP
from ctlwire.states.rank_membership import RANK_MEMBERSHIP_TABLE as RANK_MEMBERSHIP_TABLE
from ctlwire.states.rank_membership import MemberEvent as MemberEvent
from ctlwire.states.rank_membership import MemberState as MemberState
from ctlwire.states.receive_turn import RECEIVE_TURN as RECEIVE_TURN
from ctlwire.states.receive_turn import RECEIVE_TURN_TABLE as RECEIVE_TURN_TABLE
from ctlwire.states.receive_turn import TurnEvent as TurnEvent
from ctlwire.states.receive_turn import TurnState as TurnState
from ctlwire.states.transition_table import MachineSpec as MachineSpec
from ctlwire.states.transition_table import StateTable as StateTable
from ctlwire.states.transition_table import build_machine as build_machine
from ctlwire.states.transition_table import derive_table as derive_table

MACHINES = (CONTROL_REQUEST, MAILBOX_TICKET, PEER_LINK, RANK_MEMBERSHIP, INBOUND_REQUEST,
            OPERATION, OPERATION_RANK, RECEIVE_TURN)
TABLES = (CONTROL_REQUEST_TABLE, MAILBOX_TICKET_TABLE, PEER_LINK_TABLE, RANK_MEMBERSHIP_TABLE,
          INBOUND_REQUEST_TABLE, OPERATION_TABLE, OPERATION_RANK_TABLE, RECEIVE_TURN_TABLE)

# every public name bound above is exported: the imports are the one list
__all__ = sorted(name for name, value in globals().items()
                 if not name.startswith("_") and not isinstance(value, types.ModuleType))
