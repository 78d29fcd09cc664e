"""What an operation reports: per rank, the state it ended in; and its progress on the way."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ctlwire.states import OperationState, RankState

__all__ = ["OperationResult", "Phase", "ProgressEvent", "RankReport"]

Phase = Literal["apply", "compensate"]


@dataclass(frozen=True)
class ProgressEvent:
    """One rank's part of an operation changed, or reported progress.

    A state change: ``state`` after ``step`` in ``phase``; ``fraction`` is None.
    ``detail`` names the error or loss for Failed / Unknown / Quarantined;
    ``error`` is the typed error behind it, the one the step's fan-out gave
    (e.g. :class:`~ctlwire.kernel.errors.RemoteError`,
    :class:`~ctlwire.kernel.errors.OutcomeUnknown`,
    :class:`~ctlwire.kernel.errors.NotDelivered`), None when there is none.

    A progress report: what the step running on the rank said with
    :func:`~ctlwire.kernel.engine.liveness.report_progress` (``fraction`` in
    0..1 and ``note``, e.g. ``0.4, "shard 4/10"``), as the rank's heartbeats
    carry it (at most one an interval; a report that did not change is not
    repeated); ``state`` is the rank's state, unchanged (Applying or
    Compensating)."""

    op_id: str
    rank: int
    step: str
    phase: Phase
    state: RankState
    detail: str = ""
    error: Exception | None = None
    fraction: float | None = None
    note: str = ""


@dataclass(frozen=True)
class RankReport:
    """How one rank's part ended.

    ``applied``: the steps that applied on it (or may have: outcome unknown),
    in order; ``undone``: the steps whose compensation ran on it, in the order
    run; ``failed_step``/``detail``: the step (or compensation) that failed
    there and why; ``error``: the typed error of that failure, as the
    fan-out gave it (None when the rank did not fail)."""

    rank: int
    state: RankState
    applied: tuple[str, ...] = ()
    undone: tuple[str, ...] = ()
    failed_step: str | None = None
    detail: str = ""
    error: Exception | None = None


@dataclass(frozen=True)
class OperationResult:
    """The outcome of one operation: its final state and every rank's report.

    ``ok`` only when the operation committed on every rank of the fleet. Otherwise
    ``failed_ranks`` names the ranks where a step (or its compensation) failed,
    ``quarantined`` those that could not be brought back (the runner excludes
    them from later operations until released), ``superseded`` those where a
    newer operation fenced this one out, and ``left_out`` the present ranks an
    operation run without explicit ranks did not include, with why (e.g.
    ``quarantined``): they count against ``ok`` (the state may still be
    COMMITTED, on the ranks it ran on) unless the caller asked for the
    admissible ranks only (``admissible_only``). ``observed``: each rank's
    answer to the plan's post-condition (e.g. its weight version), where it
    was read."""

    op_id: str
    fence: int
    plan: str
    state: OperationState
    ranks: dict[int, RankReport] = field(default_factory=dict)
    observed: dict[int, Any] = field(default_factory=dict)
    left_out: dict[int, str] = field(default_factory=dict)
    admissible_only: bool = False

    @property
    def ok(self) -> bool:
        """Committed, and no present rank left out (unless ``admissible_only``)."""
        return self.state is OperationState.COMMITTED and (
            self.admissible_only or not self.left_out)

    def _with(self, *states: RankState) -> tuple[int, ...]:
        return tuple(sorted(r for r, rep in self.ranks.items() if rep.state in states))

    @property
    def committed(self) -> tuple[int, ...]:
        return self._with(RankState.COMMITTED)

    @property
    def compensated(self) -> tuple[int, ...]:
        return self._with(RankState.COMPENSATED)

    @property
    def quarantined(self) -> tuple[int, ...]:
        return self._with(RankState.QUARANTINED)

    @property
    def superseded(self) -> tuple[int, ...]:
        return self._with(RankState.SUPERSEDED)

    @property
    def failed_ranks(self) -> tuple[int, ...]:
        return tuple(sorted(r for r, rep in self.ranks.items() if rep.failed_step is not None))

    def summary(self) -> str:
        """One line: the state and each rank's, and the ranks left out, e.g.
        ``... committed: 0=committed 2=committed; 1 left out (rank 1: quarantined)``."""
        ranks = " ".join(f"{r}={rep.state.value}" for r, rep in sorted(self.ranks.items()))
        line = f"{self.op_id} {self.state.value}: {ranks}"
        if self.left_out:
            only = ", admissible ranks only" if self.admissible_only else ""
            line += f"; {len(self.left_out)} left out{only} (" + ", ".join(
                f"rank {r}: {why}" for r, why in sorted(self.left_out.items())) + ")"
        return line
