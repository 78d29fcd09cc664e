"""A coordinated multi-rank operation (e.g. pause -> update_weights -> resume), and
each rank's part in it.

An operation runs a declared sequence of steps across ranks, one fan-out per
step. It either commits on every rank, or it is aborted and every rank that
changed is compensated (its applied steps undone by their declared
compensating steps, in reverse order) -- and a rank that cannot be brought back
is quarantined, never left mixed without a record.

Operation (the whole)::

    Running --advance--> Running          (a step applied on every rank; next step)
    Running --commit--> Committed         (the last step applied on every rank)
    Running --abort--> Aborting           (a step failed, or its outcome is unknown, on a rank)
    Aborting --undone--> Aborted          (every rank is back: compensated or untouched)
    Aborting --degrade--> Degraded        (aborted, and some rank is quarantined)
    Running | Aborting --supersede--> Superseded  (a newer operation fenced this one out)

OperationRank (one rank's part)::

    Pending | Applied --send--> Applying --ok--> Applied --commit--> Committed
    Applying --refuse--> Failed           (the step answered an error: it did not apply)
    Applying --lose--> Unknown            (rank lost or timed out: the step may have applied)
    Applied | Failed | Unknown --compensate--> Compensating   (something to undo)
    Pending --recover--> Compensating     (a successor finishes a compensation begun before)
    Compensating --undo--> Compensating   (one compensating step done)
    Compensating --restore--> Compensated (every applied step undone)
    Applied | Failed | Unknown --skip--> Aborted   (nothing declared to undo)
    Failed --quarantine--> Quarantined    (its step raised, declared quarantine_on_error)
    Compensating --quarantine--> Quarantined  (an undo failed: cannot be brought back)
    Applying | Applied | Failed | Unknown | Compensating --supersede--> Superseded
                                          (refused by fencing: a newer operation owns it)

``Committed``, ``Compensated``, ``Aborted``, ``Quarantined`` and ``Superseded``
are the only ways a rank's part ends; a result lists every rank in one of them.
"""

from __future__ import annotations

from ctlwire.states.identity_enum import IdentityEnum
from ctlwire.states.transition_table import MachineSpec, StateTable, derive_table

__all__ = [
    "OPERATION",
    "OPERATION_RANK",
    "OPERATION_RANK_TABLE",
    "OPERATION_TABLE",
    "OperationEvent",
    "OperationState",
    "RankEvent",
    "RankState",
]


class OperationState(IdentityEnum):
    RUNNING = "running"
    ABORTING = "aborting"
    COMMITTED = "committed"
    ABORTED = "aborted"
    DEGRADED = "degraded"
    SUPERSEDED = "superseded"


class OperationEvent(IdentityEnum):
    ADVANCE = "advance"
    COMMIT = "commit"
    ABORT = "abort"
    UNDONE = "undone"
    DEGRADE = "degrade"
    SUPERSEDE = "supersede"


_O = OperationState
_OE = OperationEvent

OPERATION: MachineSpec[OperationState, OperationEvent] = MachineSpec(
    name="Operation",
    states=OperationState,
    events=OperationEvent,
    initial=_O.RUNNING,
    transitions=(
        (_OE.ADVANCE, (_O.RUNNING,), _O.RUNNING),
        (_OE.COMMIT, (_O.RUNNING,), _O.COMMITTED),
        (_OE.ABORT, (_O.RUNNING,), _O.ABORTING),
        (_OE.UNDONE, (_O.ABORTING,), _O.ABORTED),
        (_OE.DEGRADE, (_O.ABORTING,), _O.DEGRADED),
        (_OE.SUPERSEDE, (_O.RUNNING, _O.ABORTING), _O.SUPERSEDED),
    ),
    terminal=frozenset({_O.COMMITTED, _O.ABORTED, _O.DEGRADED, _O.SUPERSEDED}),
    final=frozenset({_O.COMMITTED, _O.ABORTED, _O.DEGRADED, _O.SUPERSEDED}),
    description="a coordinated multi-rank operation: commits everywhere or is compensated",
)

OPERATION_TABLE: StateTable[OperationState, OperationEvent] = derive_table(OPERATION)


class RankState(IdentityEnum):
    PENDING = "pending"
    APPLYING = "applying"
    APPLIED = "applied"
    FAILED = "failed"
    UNKNOWN = "unknown"
    COMPENSATING = "compensating"
    COMMITTED = "committed"
    COMPENSATED = "compensated"
    ABORTED = "aborted"
    QUARANTINED = "quarantined"
    SUPERSEDED = "superseded"


class RankEvent(IdentityEnum):
    SEND = "send"
    OK = "ok"
    REFUSE = "refuse"
    LOSE = "lose"
    COMMIT = "commit"
    COMPENSATE = "compensate"
    UNDO = "undo"
    RESTORE = "restore"
    SKIP = "skip"
    QUARANTINE = "quarantine"
    SUPERSEDE = "supersede"
    RECOVER = "recover"


_R = RankState
_RE = RankEvent
_RANK_ENDS = frozenset({_R.COMMITTED, _R.COMPENSATED, _R.ABORTED, _R.QUARANTINED, _R.SUPERSEDED})

OPERATION_RANK: MachineSpec[RankState, RankEvent] = MachineSpec(
    name="OperationRank",
    states=RankState,
    events=RankEvent,
    initial=_R.PENDING,
    transitions=(
        (_RE.SEND, (_R.PENDING, _R.APPLIED), _R.APPLYING),
        (_RE.OK, (_R.APPLYING,), _R.APPLIED),
        (_RE.REFUSE, (_R.APPLYING,), _R.FAILED),
        (_RE.LOSE, (_R.APPLYING,), _R.UNKNOWN),
        (_RE.COMMIT, (_R.APPLIED,), _R.COMMITTED),
        (_RE.COMPENSATE, (_R.APPLIED, _R.FAILED, _R.UNKNOWN), _R.COMPENSATING),
        (_RE.RECOVER, (_R.PENDING,), _R.COMPENSATING),
        (_RE.UNDO, (_R.COMPENSATING,), _R.COMPENSATING),
        (_RE.RESTORE, (_R.COMPENSATING,), _R.COMPENSATED),
        (_RE.SKIP, (_R.APPLIED, _R.FAILED, _R.UNKNOWN), _R.ABORTED),
        (_RE.QUARANTINE, (_R.FAILED, _R.COMPENSATING), _R.QUARANTINED),
        (_RE.SUPERSEDE, (_R.APPLYING, _R.APPLIED, _R.FAILED, _R.UNKNOWN, _R.COMPENSATING),
         _R.SUPERSEDED),
    ),
    terminal=_RANK_ENDS,
    final=_RANK_ENDS,
    description="one rank's part in an operation: committed, compensated, aborted, "
                "quarantined or superseded",
)

OPERATION_RANK_TABLE: StateTable[RankState, RankEvent] = derive_table(OPERATION_RANK)
