"""A client's ranks: which are present, alive and admissible, and their changes at run time.

:class:`RankRoster` is the part of a
:class:`~ctlwire.kernel.client.control_client.ControlClient` that owns its
rank set. A rank is *present* (in :attr:`membership`), *alive* (heard from:
the liveness monitor's peer table) and *admissible* (admitted, not
quarantined, meeting the ``admission_condition``); a fan-out without ``ranks``
goes to the admissible ranks (:meth:`routable`).

Guarantees: a rank added is tracked (heartbeats, transport route) but not
routed to by default until admitted (unless ``admit_on_join``); a rank removed
has its pending calls failed through ``fail_rank`` and is forgotten by the
transport; a rank whose registration is lost stays present while the liveness
monitor says it is alive, and leaves when the monitor loses it (the
membership's ``alive`` is the peer table's); a rank the transport refuses to add
(no or bad address) is not added; stale or fenced membership events change
nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ctlwire.kernel.client.liveness_monitor import LivenessMonitor
from ctlwire.kernel.core.fan_out_result import FanOutResult
from ctlwire.kernel.core.membership import (
    ChangeKind,
    Membership,
    MembershipChange,
    MembershipEvent,
)
from ctlwire.kernel.core.quarantine import FleetQuarantine
from ctlwire.kernel.errors import NoAdmissibleRanks, RankLeftOut
from ctlwire.transports.transport import ClientTransport

__all__ = ["RankRoster", "leave_out"]


class RankRoster:
    """The rank set of one client; see the module docstring."""

    def __init__(self, ranks: Sequence[int], transport: ClientTransport,
                 liveness: LivenessMonitor, fail_rank: Callable[[int, str], None], *,
                 admission_condition: Callable[[int], bool] | None = None,
                 admit_on_join: bool = False) -> None:
        self.ranks: tuple[int, ...] = tuple(ranks)
        self.rank_set = frozenset(self.ranks)
        self.membership = Membership(self.ranks, admit_on_join=admit_on_join,
                                     alive=liveness.peers.is_live)
        self.admission_condition = admission_condition
        #: ranks out of routing (shared by every OperationRunner over the client)
        self.quarantine = FleetQuarantine()
        self.transport = transport
        self.liveness = liveness
        self.peers = liveness.peers
        self._fail_rank = fail_rank
        liveness.on_lost = self.rank_lost

    def check(self, rank: int) -> None:
        """ValueError unless ``rank`` is present, or was and was removed."""
        if not self.knows(rank):
            raise ValueError(f"rank {rank} is not one of this client's ranks {self.ranks}")

    def knows(self, rank: int) -> bool:
        """``rank`` is present, or was and was removed (calls naming it fail typed)."""
        return rank in self.rank_set or (
            rank in self.membership.removed and self.peers.is_lost(rank))

    def targets(self, method: str, ranks: Sequence[int] | str | None
                ) -> tuple[tuple[int, ...], dict[int, str]]:
        """The ranks a fan-out of ``method`` goes to and the present ranks it leaves
        out, with why: ``ranks`` when given as ranks (ValueError unless a non-empty
        set of known ranks), else (None or ``"admissible"``) :meth:`routable`
        (NoAdmissibleRanks when none is)."""
        if ranks is not None and ranks != "admissible":
            if isinstance(ranks, str):
                raise ValueError(f"ranks must be a sequence of ranks, None or 'admissible', "
                                 f"not {ranks!r}")
            targets = tuple(ranks)
            if not targets or not (self.rank_set.issuperset(targets)
                                   or all(map(self.knows, targets))):
                raise ValueError(f"ranks {targets} must be a non-empty subset of {self.ranks}")
            return targets, {}
        targets, left_out = self.routable()
        if not targets:
            raise NoAdmissibleRanks(method, left_out)
        return targets, left_out

    def routable(self) -> tuple[tuple[int, ...], dict[int, str]]:
        """The ranks a fan-out without ``ranks`` goes to, and the present ranks it
        leaves out with why."""
        if (not self.quarantine.held and self.admission_condition is None
                and self.membership.all_admitted):
            return self.ranks, {}
        return self.membership.routable(self.quarantine, self.admission_condition)

    def apply(self, event: MembershipEvent) -> MembershipChange | None:
        """Apply one membership event (from a backend or the caller) and carry its
        change out: a rank added is tracked (heartbeats, transport route or
        connection) but not routed to by default until admitted; a rank removed
        has its pending calls failed (NotDelivered: not handed over, a retry is
        safe; OutcomeUnknown: handed over, it may have run) and is forgotten by
        the transport; a rank whose registration is lost while it is alive
        stays as it is (routed to, its calls untouched); a rank re-registered
        (newer incarnation) must be admitted again; one moved gets its new
        address. Stale or fenced events change nothing (counted in
        ``membership.counters``); returns None for them.
        A transport that connects to each rank needs the address of a rank
        added: ValueError without one (and the rank is not added)."""
        change = self.membership.apply(event)
        if change is None:
            return None
        rank = change.rank
        if change.kind is ChangeKind.ADDED:
            try:
                self.transport.add_rank(rank, event.address)
            except BaseException:
                self.membership.undo_add(rank)  # refused (no or bad address): not added
                raise
            self.liveness.add_rank(rank)
        elif change.kind is ChangeKind.REMOVED:
            self._forget(rank, change.reason)
        elif (change.old is not None and change.member is not None
              and change.member.address != change.old.address):  # moved (or re-registered)
            self.transport.move_rank(rank, event.address)
        self.ranks = self.membership.ranks
        self.rank_set = frozenset(self.ranks)
        return change

    def rank_lost(self, rank: int) -> None:
        """The liveness monitor lost ``rank``: if its registration is lost too, it
        leaves (its calls were failed by the loss already)."""
        change = self.membership.rank_died(rank)
        if change is not None:
            self._forget(rank, change.reason)

    def _forget(self, rank: int, reason: str) -> None:
        self._fail_rank(rank, reason)
        self.liveness.remove_rank(rank)
        self.transport.remove_rank(rank)
        self.ranks = self.membership.ranks
        self.rank_set = frozenset(self.ranks)

    def admit(self, rank: int) -> bool:
        """Route to present ``rank`` by default from now on; True when it was not
        admitted; ValueError when it is not present."""
        if rank not in self.membership:
            raise ValueError(f"rank {rank} is not one of this client's ranks {self.ranks}")
        return self.membership.admit(rank)

    def status(self, rank: int) -> dict[str, Any]:
        """What this client knows of ``rank``: its PeerLink state (CONNECTED,
        BUSY, STALLED, SUSPECT, LOST, UNKNOWN), incarnation, and the request or
        step it was last reported running, for how long, with its progress;
        ``quarantined``: why it is out of routing (None when it is not).
        The three predicates: ``present`` (in :attr:`membership`), ``alive``
        (heard from and not lost), ``admissible`` (routed to by default), and
        ``excluded``: why it is not admissible (None when it is). A rank removed
        earlier is reported not present; ValueError for a rank never known."""
        member = self.membership.get(rank)
        if member is None:
            if rank not in self.membership.removed:
                raise ValueError(
                    f"rank {rank} is not one of this client's ranks {self.ranks}")
            status: dict[str, Any] = {"state": "UNKNOWN", "incarnation": 0}
        else:
            status = self.liveness.rank_status(rank)
        held = self.quarantine.get(rank)
        status["quarantined"] = None if held is None else {
            "op": held.op_id, "step": held.step, "detail": held.detail}
        why = self.membership.exclusion(rank, self.quarantine, self.admission_condition)
        status["present"] = member is not None
        status["alive"] = self.peers.is_live(rank)
        status["admissible"] = why is None
        status["excluded"] = why
        status["member"] = None if member is None else {
            "address": member.address, "incarnation": member.incarnation,
            "revision": member.revision, "admitted": member.admitted,
            "registration": member.state.value}
        return status


def leave_out(result: FanOutResult, left_out: dict[int, str], admissible_only: bool) -> None:
    """Record on ``result`` the present ranks its fan-out did not address (from
    :meth:`RankRoster.targets`), each with its typed error; ``admissible_only``:
    the caller asked for the admissible ranks only, so they do not count."""
    result.left_out = left_out
    result.left_out_errors = {r: RankLeftOut(r, why) for r, why in left_out.items()}
    result.admissible_only = admissible_only
