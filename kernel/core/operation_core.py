"""The sans-IO coordinator of a multi-rank operation (no anyio, no sockets, no clock).

:class:`OperationCore` is handed a declared
:class:`~ctlwire.kernel.core.operation_plan.OperationPlan`, the ranks, an
operation id and a fencing token. Its driver (the anyio shell
:class:`~ctlwire.kernel.operation_runner.OperationRunner`, or the exhaustive
explorer in the tests) loops::

    while (d := core.next_dispatch()) is not None:
        ...send d.method(d.payload) to d.ranks with key d.key and fence d.fence...
        for rank in d.ranks:
            core.record(rank, outcome, detail)     # in any order
    result = core.result()

Guarantees (checked for every outcome at every step on up to three ranks):

* **Forward, all or nothing.** Step *i+1* is dispatched only once step *i*
  applied on every rank. A rank ends Committed only if every rank does.
* **Never mixed silently.** After any fault (an error, an undelivered request,
  an unknown outcome) no further step is dispatched; every rank on which a
  step applied, or may have applied, has each such step's compensation
  dispatched to it, newest first, and ends Compensated -- or, when a
  compensation fails there (or its step raised with ``quarantine_on_error``),
  Quarantined. A rank with nothing to undo ends Aborted. A compensation is
  never sent to a rank for a step that certainly did not apply there.
* **Fenced out means hands off.** A rank that refuses a step as fenced (a newer
  operation started on it) ends Superseded, and so does the operation: this
  controller sends nothing more (a compensation would race its successor).
* **Post-condition before commit.** A plan's
  :class:`~ctlwire.kernel.core.operation_plan.PostCondition` is checked on every
  rank once the last step applied everywhere (one more dispatch, ``check``
  set, step ``"(postcondition)"``); a rank where it does not hold (or does not
  answer) fails, and the operation is compensated like after a failed step.
* **Idempotent and fenced on the wire.** Every dispatch carries the operation's
  fencing token and the key ``"{op_id}:{step}"`` (``"{op_id}:{step}:undo"``
  for a compensation), so a retried operation (same id and token, e.g. after
  the controller restarted) replays recorded results instead of re-applying.
* Every rank transition goes through the ``OperationRank`` table and the
  operation's through the ``Operation`` table (an illegal one raises
  :class:`~ctlwire.states.IllegalTransition`), and each is reported to the
  ``observer`` as a :class:`~ctlwire.kernel.core.operation_result.ProgressEvent`,
  and so is each progress report a rank's engine makes while a dispatch runs
  there (:meth:`OperationCore.report`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ctlwire.kernel.core.operation_plan import OperationPlan, step_key
from ctlwire.kernel.core.operation_result import OperationResult, Phase, ProgressEvent, RankReport
from ctlwire.states import (
    OPERATION_RANK_TABLE,
    OPERATION_TABLE,
    OperationEvent,
    OperationState,
    RankEvent,
    RankState,
)

__all__ = ["POSTCONDITION_STEP", "Dispatch", "OperationCore", "StepOutcome"]

POSTCONDITION_STEP = "(postcondition)"
"""The step name progress events and reports use for the plan's post-condition check."""

_R = RankState
_RE = RankEvent
_O = OperationState
_OE = OperationEvent


class StepOutcome(Enum):
    """What one rank's part of one dispatch came to."""

    OK = "ok"                          # applied
    ERROR = "error"                    # answered with an error: did not apply
    NOT_DELIVERED = "not_delivered"    # never handed to the transport: did not apply
    UNKNOWN = "unknown"                # lost or timed out after hand-over: may have applied
    FENCED = "fenced"                  # refused: a newer operation holds this rank
    NOT_APPLIED = "not_applied"        # a compensation refused: its step never applied there


@dataclass(frozen=True)
class Dispatch:
    """One fan-out the driver must send: ``method(payload)`` to ``ranks``."""

    op_id: str
    phase: Phase
    step: str
    method: str
    payload: Any
    timeout: float | None
    ranks: tuple[int, ...]
    key: str
    fence: int
    index: int = -1  # the step's position in the plan
    check: bool = False  # the plan's post-condition: a read-only method, not a step


class OperationCore:
    """Decides what to send next, whom to compensate and whom to quarantine."""

    def __init__(self, plan: OperationPlan, ranks: Sequence[int], *, op_id: str, fence: int,
                 observer: Callable[[ProgressEvent], None] | None = None) -> None:
        if not ranks or len(set(ranks)) != len(ranks):
            raise ValueError(f"an operation needs distinct ranks, got {tuple(ranks)}")
        if fence <= 0:
            raise ValueError("an operation's fencing token must be positive")
        self.plan = plan
        self.ranks: tuple[int, ...] = tuple(ranks)
        self.op_id = op_id
        self.fence = fence
        self.observer = observer
        self.state = _O.RUNNING
        self._rank: dict[int, RankState] = {r: _R.PENDING for r in self.ranks}
        self._applied: dict[int, list[int]] = {r: [] for r in self.ranks}
        self._undone: dict[int, list[str]] = {r: [] for r in self.ranks}
        self._failed: dict[int, tuple[str, str]] = {}
        self._detail: dict[int, str] = {}
        self._to_undo: dict[int, list[int]] = {}
        self._quarantine_now: set[int] = set()
        self._index = 0
        self._undo_index = -1
        self._inflight: Dispatch | None = None
        self._outcomes: dict[int, tuple[StepOutcome, str, Exception | None]] = {}
        self._reported: dict[int, tuple[float, str]] = {}  # rank -> its last progress report
        self._error: dict[int, Exception] = {}
        self.dispatches: list[Dispatch] = []

    def clone(self) -> OperationCore:
        """An independent copy (same plan, observer and history), for explorers."""
        other = object.__new__(OperationCore)
        other.__dict__.update(self.__dict__)
        other._rank = dict(self._rank)
        other._applied = {r: list(v) for r, v in self._applied.items()}
        other._undone = {r: list(v) for r, v in self._undone.items()}
        other._failed = dict(self._failed)
        other._detail = dict(self._detail)
        other._to_undo = {r: list(v) for r, v in self._to_undo.items()}
        other._quarantine_now = set(self._quarantine_now)
        other._outcomes = dict(self._outcomes)
        other._reported = dict(self._reported)
        other._error = dict(self._error)
        other.dispatches = list(self.dispatches)
        other.__class__ = self.__class__
        return other

    def state_key(self) -> tuple[Any, ...]:
        """Everything that decides what this core does next, hashable (for explorers)."""
        return (self.state, tuple(self._rank.items()), self._index, self._undo_index,
                self._inflight, tuple(sorted(self._outcomes.items())),
                tuple((r, tuple(v)) for r, v in self._applied.items()),
                tuple((r, tuple(v)) for r, v in sorted(self._to_undo.items())),
                tuple(sorted(self._quarantine_now)))

    def resume_forward(self, applied: Mapping[int, Sequence[str]]) -> None:
        """Take over an operation another controller ran forward: ``applied``, per
        rank, the steps its ledger already applied. The steps are sent again from
        the first (the ledgers answer those already applied from their records);
        should the operation abort, every step applied on a rank -- these
        included -- is compensated there. Only before the first dispatch."""
        if self.dispatches or self.state is not _O.RUNNING:
            raise RuntimeError(f"{self.op_id}: an operation is taken over before any dispatch")
        for r in self.ranks:
            self._applied[r] = [self.plan.index(name) for name in applied.get(r, ())]

    def finish_compensation(self, applied: Mapping[int, Sequence[str]],
                            undone: Mapping[int, Sequence[str]]) -> None:
        """Take over an operation whose compensation another controller began.

        ``applied``/``undone``: per rank, the steps its ledger applied and the
        compensations it already ran. Every rank goes to Compensating; the
        dispatches that follow undo what remains, newest first. Only before the
        first dispatch (RuntimeError otherwise)."""
        if self.dispatches or self.state is not _O.RUNNING:
            raise RuntimeError(f"{self.op_id}: a compensation is taken over before any dispatch")
        steps = self.plan.steps
        first = steps[0].name
        self._op(_OE.ABORT)
        for r in self.ranks:
            done = list(undone.get(r, ()))
            indices = [self.plan.index(name) for name in applied.get(r, ())]
            self._applied[r] = indices
            self._undone[r] = done
            self._to_undo[r] = [j for j in reversed(indices)
                                if steps[j].compensation is not None
                                and steps[j].name not in done]
            self._go(r, _RE.RECOVER, first, "compensate")
        self._undo_index = len(steps) - 1

    def report(self, rank: int, fraction: float, note: str = "") -> bool:
        """``rank``'s engine reports the progress of the dispatch in flight (its
        step's ``report_progress(fraction, note)``): the observer gets it as a
        :class:`~ctlwire.kernel.core.operation_result.ProgressEvent` with
        ``fraction`` and ``note`` set and the rank's state unchanged. A report
        equal to the rank's last one, or from a rank that is not in the dispatch
        or already has its outcome, is not an event. True when it was one."""
        d = self._inflight
        if d is None or rank not in d.ranks or rank in self._outcomes:
            return False
        if self._reported.get(rank) == (fraction, note):
            return False
        self._reported[rank] = (fraction, note)
        if self.observer is not None:
            self.observer(ProgressEvent(self.op_id, rank, d.step, d.phase, self._rank[rank],
                                        fraction=fraction, note=note))
        return True

    def has_outcome(self, rank: int) -> bool:
        """Whether ``rank`` already has an outcome for the dispatch in flight."""
        return self._inflight is not None and rank in self._outcomes

    # -- queries ---------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.state in OPERATION_TABLE.final

    @property
    def inflight(self) -> Dispatch | None:
        return self._inflight

    def rank_state(self, rank: int) -> RankState:
        return self._rank[rank]

    def snapshot(self) -> dict[str, Any]:
        """The live view: operation state, the latest step dispatched (and whether it
        is still in flight), each rank's state."""
        d = self.dispatches[-1] if self.dispatches else None
        return {"op_id": self.op_id, "plan": self.plan.name, "fence": self.fence,
                "state": self.state.value,
                "step": None if d is None else d.step,
                "phase": None if d is None else d.phase,
                "in_flight": self._inflight is not None,
                "ranks": {r: s.value for r, s in self._rank.items()}}

    # -- transitions -------------------------------------------------------------
    def _go(self, rank: int, event: RankEvent, step: str, phase: Phase, detail: str = "",
            error: Exception | None = None) -> None:
        self._rank[rank] = OPERATION_RANK_TABLE.apply(self._rank[rank], event, rank)
        if self.observer is not None:
            self.observer(ProgressEvent(self.op_id, rank, step, phase, self._rank[rank], detail,
                                        error))

    def _op(self, event: OperationEvent) -> None:
        self.state = OPERATION_TABLE.apply(self.state, event, self.op_id)

    # -- driving -----------------------------------------------------------------
    def next_dispatch(self) -> Dispatch | None:
        """The next fan-out to send, or None once the operation is decided.

        Raises RuntimeError while a dispatch still has ranks without an outcome."""
        if self._inflight is not None:
            raise RuntimeError(f"{self.op_id}: dispatch {self._inflight.key!r} is still in flight")
        if self.state is _O.RUNNING and self._index == len(self.plan.steps):
            pc = self.plan.postcondition
            assert pc is not None
            for r in self.ranks:
                self._go(r, _RE.SEND, POSTCONDITION_STEP, "apply")
            d = Dispatch(self.op_id, "apply", POSTCONDITION_STEP, pc.method, pc.payload,
                         pc.timeout, self.ranks, "", self.fence, self._index, check=True)
        elif self.state is _O.RUNNING:
            step = self.plan.steps[self._index]
            for r in self.ranks:
                self._go(r, _RE.SEND, step.name, "apply")
            d = Dispatch(self.op_id, "apply", step.name, step.method, step.payload, step.timeout,
                         self.ranks, step_key(self.op_id, step.name), self.fence, self._index)
        elif self.state is _O.ABORTING:
            found: Dispatch | None = None
            while found is None and self._undo_index >= 0:
                j = self._undo_index
                self._undo_index -= 1
                targets = tuple(r for r in self.ranks
                                if self._rank[r] is _R.COMPENSATING and self._to_undo[r]
                                and self._to_undo[r][0] == j)
                if targets:
                    step = self.plan.steps[j]
                    comp = step.compensation
                    assert comp is not None
                    found = Dispatch(self.op_id, "compensate", step.name, comp.method,
                                     comp.payload,
                                     comp.timeout if comp.timeout is not None else step.timeout,
                                     targets, step_key(self.op_id, step.name, undo=True),
                                     self.fence, j)
            if found is None:
                self._finish_abort()
                return None
            d = found
        else:
            return None
        self._inflight = d
        self._outcomes = {}
        self._reported = {}
        self.dispatches.append(d)
        return d

    def record(self, rank: int, outcome: StepOutcome, detail: str = "",
               error: Exception | None = None) -> None:
        """``rank``'s outcome of the dispatch in flight (each rank once, any order);
        ``error``: the typed error behind a failure, as the fan-out gave it."""
        d = self._inflight
        if d is None or rank not in d.ranks:
            raise ValueError(f"{self.op_id}: no outcome expected from rank {rank}")
        if rank in self._outcomes:
            raise ValueError(f"{self.op_id}: rank {rank} already has an outcome for {d.key!r}")
        self._outcomes[rank] = (outcome, detail, error)
        if len(self._outcomes) == len(d.ranks):
            self._inflight = None
            if d.phase == "apply":
                self._settle_apply(d)
            else:
                self._settle_compensation(d)

    def _settle_apply(self, d: Dispatch) -> None:
        i = self._index
        steps = self.plan.steps
        check = i == len(steps)  # the post-condition: nothing applies, a mismatch fails
        name = POSTCONDITION_STEP if check else steps[i].name
        for r in d.ranks:
            outcome, detail, error = self._outcomes[r]
            if outcome is StepOutcome.OK:
                if not check and i not in self._applied[r]:
                    self._applied[r].append(i)
                self._go(r, _RE.OK, name, "apply")
            elif outcome is StepOutcome.UNKNOWN and not check:
                if i not in self._applied[r]:
                    self._applied[r].append(i)  # may have applied: undo it too
                self._failed[r] = (name, detail)
                self._note_error(r, error)
                self._go(r, _RE.LOSE, name, "apply", detail, error)
            elif outcome is StepOutcome.FENCED:
                self._detail[r] = detail
                self._note_error(r, error)
                self._go(r, _RE.SUPERSEDE, name, "apply", detail, error)
            else:
                self._failed[r] = (name, detail)
                self._note_error(r, error)
                if outcome is StepOutcome.ERROR and not check and steps[i].quarantine_on_error:
                    self._quarantine_now.add(r)
                self._go(r, _RE.REFUSE, name, "apply", detail, error)
        outcomes = {o for o, _, _ in self._outcomes.values()}
        if StepOutcome.FENCED in outcomes:
            self._op(_OE.SUPERSEDE)
            for r in self.ranks:
                if self._rank[r] not in OPERATION_RANK_TABLE.final:
                    self._go(r, _RE.SUPERSEDE, name, "apply", "a newer operation took over")
            return
        if outcomes == {StepOutcome.OK}:
            if i + 1 < len(steps) or (not check and self.plan.postcondition is not None):
                self._index += 1
                self._op(_OE.ADVANCE)
                return
            for r in self.ranks:
                self._go(r, _RE.COMMIT, name, "apply")
            self._op(_OE.COMMIT)
            return
        self._op(_OE.ABORT)
        for r in self.ranks:
            if r in self._quarantine_now:
                self._go(r, _RE.QUARANTINE, name, "apply", self._failed[r][1],
                         self._error.get(r))
                continue
            undo = [j for j in reversed(self._applied[r])
                    if steps[j].compensation is not None]
            if undo:
                self._to_undo[r] = undo
                self._go(r, _RE.COMPENSATE, name, "compensate")
            else:
                self._go(r, _RE.SKIP, name, "compensate")
        self._undo_index = len(steps) - 1  # from the newest step any rank applied

    def _settle_compensation(self, d: Dispatch) -> None:
        for r in d.ranks:
            outcome, detail, error = self._outcomes[r]
            if outcome is StepOutcome.OK or outcome is StepOutcome.NOT_APPLIED:
                self._to_undo[r].pop(0)
                if outcome is StepOutcome.OK:
                    self._undone[r].append(d.step)
                self._go(r, _RE.UNDO, d.step, "compensate", detail)
            elif outcome is StepOutcome.FENCED:
                self._detail[r] = detail
                self._note_error(r, error)
                self._go(r, _RE.SUPERSEDE, d.step, "compensate", detail, error)
            else:
                self._failed.setdefault(r, (f"{d.step}:undo", detail))
                self._detail[r] = f"undo of {d.step!r} failed: {detail}"
                self._note_error(r, error)
                self._go(r, _RE.QUARANTINE, d.step, "compensate", self._detail[r], error)
        if any(o is StepOutcome.FENCED for o, _, _ in self._outcomes.values()):
            # a newer operation holds some rank: send nothing more, hand the rest over
            for r in self.ranks:
                if self._rank[r] not in OPERATION_RANK_TABLE.final:
                    self._go(r, _RE.SUPERSEDE, d.step, "compensate",
                             "a newer operation took over")
            self._op(_OE.SUPERSEDE)

    def _note_error(self, rank: int, error: Exception | None) -> None:
        """Keep the first typed error of ``rank``'s failure (the one its report names)."""
        if error is not None:
            self._error.setdefault(rank, error)

    def _finish_abort(self) -> None:
        for r in self.ranks:
            if self._rank[r] is _R.COMPENSATING:
                self._go(r, _RE.RESTORE, self.plan.steps[0].name, "compensate")
        states = set(self._rank.values())
        if _R.QUARANTINED in states:
            self._op(_OE.DEGRADE)
        elif _R.SUPERSEDED in states:
            self._op(_OE.SUPERSEDE)
        else:
            self._op(_OE.UNDONE)

    # -- outcome -----------------------------------------------------------------
    def result(self) -> OperationResult:
        """Every rank's report; the operation must be decided (RuntimeError otherwise)."""
        if not self.done:
            raise RuntimeError(f"{self.op_id} is still {self.state.name}")
        names = [s.name for s in self.plan.steps]
        reports = {}
        for r in self.ranks:
            failed = self._failed.get(r)
            detail = self._detail.get(r) or (failed[1] if failed else "")
            reports[r] = RankReport(r, self._rank[r], tuple(names[j] for j in self._applied[r]),
                                    tuple(self._undone[r]), failed[0] if failed else None,
                                    detail, self._error.get(r))
        return OperationResult(self.op_id, self.fence, self.plan.name, self.state, reports)
