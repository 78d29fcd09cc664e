"""The fleet's quarantine: ranks out of routing, and why (sans-IO).

One :class:`FleetQuarantine` belongs to a
:class:`~ctlwire.kernel.client.control_client.ControlClient` (``client.quarantine``)
and every :class:`~ctlwire.kernel.operations.runner.OperationRunner` over that
client shares it. A fan-out without explicit ``ranks`` leaves quarantined
ranks out; a caller reaches one only by naming it. The set is shown by
``client.rank_status(rank)["quarantined"]`` and the client's metrics.

It also keeps what the ranks in routing serve (:attr:`FleetQuarantine.serving`):
the post-condition of the newest operation that committed on every admissible
rank, which a quarantined rank must meet to be released.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["FleetQuarantine", "Quarantine"]


@dataclass(frozen=True)
class Quarantine:
    """Why a rank is out of routing: the operation, the step that failed there, the
    detail and the typed error of that failure; ``postcondition`` (a
    :class:`~ctlwire.kernel.core.operation_plan.PostCondition` or None) is what
    the rank must meet before it is released without ``force``."""

    rank: int
    op_id: str
    step: str
    detail: str
    error: Exception | None = None
    postcondition: Any = None


class FleetQuarantine:
    """Quarantined ranks by rank, with counters; ``serving``: the post-condition
    (a :class:`~ctlwire.kernel.core.operation_plan.PostCondition`) of the newest
    operation that committed on every admissible rank, None before one did."""

    def __init__(self) -> None:
        self.held: dict[int, Quarantine] = {}
        self.counters: dict[str, int] = {"quarantines": 0, "released": 0}
        self.serving: Any = None

    def __bool__(self) -> bool:
        return bool(self.held)

    def __contains__(self, rank: object) -> bool:
        return rank in self.held

    def add(self, record: Quarantine) -> None:
        """Hold ``record.rank`` (a newer record replaces an older one)."""
        if record.rank not in self.held:
            self.counters["quarantines"] += 1
        self.held[record.rank] = record

    def get(self, rank: int) -> Quarantine | None:
        return self.held.get(rank)

    def remove(self, rank: int) -> Quarantine:
        """Release ``rank``; KeyError when it is not held."""
        record = self.held.pop(rank)
        self.counters["released"] += 1
        return record

    def routable(self, ranks: Iterable[int]) -> tuple[int, ...]:
        """``ranks`` without the quarantined ones, in their order."""
        held = self.held
        return tuple(r for r in ranks if r not in held)

    def snapshot(self) -> dict[int, dict[str, str]]:
        """Each quarantined rank: the operation, step and detail (JSON-able)."""
        return {r: {"op": q.op_id, "step": q.step, "detail": q.detail}
                for r, q in sorted(self.held.items())}
