"""The sans-IO operation coordinator, explored exhaustively.

With k <= 3 ranks and, for every dispatch, every rank's outcome chosen among
ok / error / not delivered / unknown (which really applied, or really did not)
/ fenced, in every arrival order, the explorer checks that every rank ends
Committed, Compensated, Aborted, Quarantined or Superseded as the result says,
and that no rank the result calls Compensated or Aborted still carries a change
(an engine model tracks what really applied). A deliberately broken core is
caught, so the explorer can fail.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from ctlwire.kernel.operation_core import Dispatch, OperationCore, StepOutcome
from ctlwire.kernel.operation_plan import (
    OperationPlan,
    OperationStep,
    StepCall,
    new_fence,
    new_operation_id,
    step_key,
)
from ctlwire.kernel.operation_result import ProgressEvent
from ctlwire.states import IllegalTransition, OperationState, RankState

_R = RankState
_O = OperationState


def weight_sync(quarantine_on_error: bool = False) -> OperationPlan:
    return OperationPlan("weight-sync", (
        OperationStep("pause", "pause", compensation=StepCall("resume")),
        OperationStep("update", "update_weights", 7, compensation=StepCall("restore_weights", 6),
                      quarantine_on_error=quarantine_on_error),
        OperationStep("resume", "resume"),
    ))


def with_benign_step() -> OperationPlan:
    return OperationPlan("probe", (
        OperationStep("pause", "pause", compensation=StepCall("resume")),
        OperationStep("info", "get_server_info"),  # nothing to undo
        OperationStep("flush", "flush_cache", compensation=StepCall("noop")),
    ))


# outcome choices: (what the core is told, whether the engine really applied it)
CHOICES: tuple[tuple[StepOutcome, bool], ...] = (
    (StepOutcome.OK, True),
    (StepOutcome.ERROR, False),
    (StepOutcome.NOT_DELIVERED, False),
    (StepOutcome.UNKNOWN, True),
    (StepOutcome.UNKNOWN, False),
    (StepOutcome.FENCED, False),
)


@dataclass
class World:
    core: OperationCore
    applied: dict[int, set[int]]                 # what really changed on each engine
    maybe: dict[int, set[int]]                   # steps the core was told ok or unknown
    fault: bool = False                          # some rank had a non-ok apply outcome
    fenced: bool = False
    faulty_ranks: set[int] = field(default_factory=set)
    undo_order: dict[int, list[int]] = field(default_factory=dict)
    events: list[ProgressEvent] = field(default_factory=list)


class Violation(AssertionError):
    pass


def check_dispatch(w: World, d: Dispatch) -> None:
    core = w.core
    if w.fenced:
        raise Violation(f"dispatch {d.key} after a rank fenced the operation out")
    if d.fence != core.fence or d.op_id != core.op_id:
        raise Violation(f"dispatch {d.key} carries the wrong fence or operation")
    index = core.plan.index(d.step)
    if d.phase == "apply":
        if w.fault:
            raise Violation(f"forward step {d.step} dispatched after a fault")
        if d.ranks != core.ranks or d.key != step_key(core.op_id, d.step):
            raise Violation(f"forward step {d.step}: ranks {d.ranks}, key {d.key}")
        if any(index - 1 not in w.maybe[r] for r in d.ranks if index > 0):
            raise Violation(f"step {d.step} sent before the previous applied everywhere")
    else:
        if d.key != step_key(core.op_id, d.step, undo=True):
            raise Violation(f"compensation key {d.key}")
        comp = core.plan.steps[index].compensation
        if comp is None or d.method != comp.method:
            raise Violation(f"compensation of {d.step} sends {d.method}")
        for r in d.ranks:
            if index not in w.maybe[r]:
                raise Violation(f"undo of {d.step} sent to rank {r}, where it never applied")
            order = w.undo_order.setdefault(r, [])
            if order and order[-1] <= index:
                raise Violation(f"rank {r}: undo order {[*order, index]} is not newest first")
            order.append(index)


def check_final(w: World) -> None:
    core = w.core
    if not core.done:
        raise Violation(f"no dispatch left but the operation is {core.state}")
    res = core.result()
    states = {r: rep.state for r, rep in res.ranks.items()}
    assert set(states) == set(core.ranks)
    ends = {_R.COMMITTED, _R.COMPENSATED, _R.ABORTED, _R.QUARANTINED, _R.SUPERSEDED}
    if not set(states.values()) <= ends:
        raise Violation(f"ranks not in an end state: {states}")
    committed = [r for r, s in states.items() if s is _R.COMMITTED]
    if committed and len(committed) != len(states):
        raise Violation(f"mixed: committed {committed} but {states}")
    if res.state is _O.COMMITTED:
        n = len(core.plan.steps)
        if committed != list(core.ranks) or any(w.applied[r] != set(range(n)) for r in committed):
            raise Violation(f"committed but applied {w.applied}")
    for r, s in states.items():
        if s in (_R.COMPENSATED, _R.ABORTED):
            left = {j for j in w.applied[r] if core.plan.steps[j].compensation is not None}
            if left:
                raise Violation(f"rank {r} reported {s.name} but still has {left} applied")
    if res.state is _O.ABORTED and not set(states.values()) <= {_R.COMPENSATED, _R.ABORTED}:
        raise Violation(f"aborted but {states}")
    if res.state is _O.DEGRADED and _R.QUARANTINED not in states.values():
        raise Violation(f"degraded without a quarantined rank: {states}")
    if res.state is _O.SUPERSEDED and _R.SUPERSEDED not in states.values():
        raise Violation(f"superseded without a superseded rank: {states}")
    if res.state is not _O.COMMITTED and not w.fenced and not w.faulty_ranks <= set(
            res.failed_ranks):
        raise Violation(f"faulty ranks {w.faulty_ranks} not all named in {res.failed_ranks}")
    last = {}
    for ev in w.events:
        last[ev.rank] = ev.state
    if last != states:
        raise Violation(f"progress ended at {last}, result says {states}")


def clone(w: World) -> World:
    events = list(w.events)
    core = w.core.clone()
    core.observer = events.append
    return World(core, {r: set(s) for r, s in w.applied.items()},
                 {r: set(s) for r, s in w.maybe.items()}, w.fault, w.fenced,
                 set(w.faulty_ranks), {r: list(v) for r, v in w.undo_order.items()}, events)


def key(w: World) -> tuple[Any, ...]:
    c = w.core
    return (c.state, tuple(sorted(c.rank_states().items())), tuple(c.dispatches),
            tuple(sorted((r, tuple(sorted(s))) for r, s in w.applied.items())),
            tuple(sorted(c._outcomes.items())), w.fenced, w.fault,
            tuple(sorted((r, tuple(v)) for r, v in c._applied.items())),
            tuple(sorted((r, tuple(v)) for r, v in c._to_undo.items())),
            tuple(sorted((r, tuple(sorted(v))) for r, v in w.maybe.items())),
            tuple(sorted(w.faulty_ranks)))


def explore(plan: OperationPlan, k: int, core_cls: type[OperationCore] = OperationCore,
            choices: tuple[tuple[StepOutcome, bool], ...] = CHOICES, *,
            every_order: bool = True) -> int:
    """Every path; returns the number of distinct states visited. Raises Violation.

    ``every_order``: outcomes of one dispatch arrive in every order (else in rank order)."""
    ranks = tuple(range(k))
    fence = new_fence()
    events: list[ProgressEvent] = []
    core = core_cls(plan, ranks, op_id=new_operation_id(plan.name, fence), fence=fence,
                    observer=events.append)
    root = World(core, {r: set() for r in ranks}, {r: set() for r in ranks}, events=events)
    seen: set[tuple[Any, ...]] = set()

    def visit(w: World) -> None:
        k_ = key(w)
        if k_ in seen:
            return
        seen.add(k_)
        d = w.core.inflight
        if d is None:
            d = w.core.next_dispatch()
            if d is None:
                check_final(w)
                return
            check_dispatch(w, d)
        index = w.core.plan.index(d.step)
        waiting = [r for r in d.ranks if r not in w.core._outcomes]
        for rank in waiting if every_order else waiting[:1]:
            for outcome, really in choices:
                child = clone(w)
                if d.phase == "apply":
                    if really:
                        child.applied[rank].add(index)
                    if outcome in (StepOutcome.OK, StepOutcome.UNKNOWN):
                        child.maybe[rank].add(index)
                    if outcome is not StepOutcome.OK:
                        child.fault = child.fault or outcome is not StepOutcome.FENCED
                        if outcome is not StepOutcome.FENCED:
                            child.faulty_ranks.add(rank)
                elif really and outcome in (StepOutcome.OK, StepOutcome.UNKNOWN):
                    child.applied[rank].discard(index)  # the undo ran
                if outcome is StepOutcome.FENCED:
                    child.fenced = True
                child.core.record(rank, outcome, f"{outcome.value} at {d.key}")
                visit(child)

    visit(root)
    return len(seen)


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("plan", [weight_sync(), weight_sync(True), with_benign_step()],
                         ids=["weight-sync", "weight-sync-quarantine", "benign-step"])
def test_every_fault_at_every_step_on_every_rank_ends_named(plan: OperationPlan, k: int) -> None:
    # three ranks: outcomes in rank order (the core decides only once a dispatch has
    # every outcome, which test_arrival_order_does_not_matter checks on two)
    states = explore(plan, k, every_order=k < 3)
    assert states > 10


def test_arrival_order_does_not_matter() -> None:
    for plan in (weight_sync(), weight_sync(True)):
        assert explore(plan, 2, every_order=True) > explore(plan, 2, every_order=False)


class ForgetsUnknownOutcomes(OperationCore):
    """Broken: treats an unknown outcome as 'did not apply' (so never undoes it)."""

    def record(self, rank: int, outcome: StepOutcome, detail: str = "") -> None:
        if outcome is StepOutcome.UNKNOWN and self.inflight is not None \
                and self.inflight.phase == "apply":
            outcome = StepOutcome.ERROR
        super().record(rank, outcome, detail)


def test_explorer_catches_a_core_that_forgets_unknown_outcomes() -> None:
    with pytest.raises(Violation, match="still has"):
        explore(weight_sync(), 2, ForgetsUnknownOutcomes)


class CommitsDespiteErrors(OperationCore):
    """Broken: a step that erred on one rank counts as applied everywhere."""

    def record(self, rank: int, outcome: StepOutcome, detail: str = "") -> None:
        if outcome is StepOutcome.ERROR:
            outcome = StepOutcome.OK
        super().record(rank, outcome, detail)


def test_explorer_catches_a_core_that_commits_despite_errors() -> None:
    with pytest.raises(Violation, match="committed but applied"):
        explore(weight_sync(), 2, CommitsDespiteErrors)


def drive(core: OperationCore, outcomes: dict[tuple[str, str, int], StepOutcome]) -> list[str]:
    sent = []
    while (d := core.next_dispatch()) is not None:
        sent.append(f"{d.phase}:{d.step}:{','.join(map(str, d.ranks))}")
        for r in d.ranks:
            core.record(r, outcomes.get((d.phase, d.step, r), StepOutcome.OK), "boom")
    return sent


def test_update_error_on_one_rank_compensates_the_others() -> None:
    core = OperationCore(weight_sync(), (0, 1, 2), op_id="op", fence=5)
    sent = drive(core, {("apply", "update", 1): StepOutcome.ERROR})
    assert sent == ["apply:pause:0,1,2", "apply:update:0,1,2", "compensate:update:0,2",
                    "compensate:pause:0,1,2"]
    res = core.result()
    assert res.state is _O.ABORTED and res.failed_ranks == (1,)
    assert res.compensated == (0, 1, 2)
    assert res.ranks[1].applied == ("pause",) and res.ranks[1].undone == ("pause",)
    assert res.ranks[0].undone == ("update", "pause")


def test_quarantine_on_error_keeps_the_failed_rank_paused() -> None:
    core = OperationCore(weight_sync(True), (0, 1, 2), op_id="op", fence=5)
    sent = drive(core, {("apply", "update", 1): StepOutcome.ERROR})
    assert sent[-1] == "compensate:pause:0,2"
    res = core.result()
    assert res.state is _O.DEGRADED and res.quarantined == (1,) and res.compensated == (0, 2)


def test_lost_rank_is_quarantined_when_its_undo_cannot_be_delivered() -> None:
    core = OperationCore(weight_sync(), (0, 1), op_id="op", fence=5)
    drive(core, {("apply", "update", 1): StepOutcome.UNKNOWN,
                 ("compensate", "update", 1): StepOutcome.NOT_DELIVERED})
    res = core.result()
    assert res.state is _O.DEGRADED and res.quarantined == (1,) and res.compensated == (0,)
    assert res.ranks[1].failed_step == "update" and "undo" in res.ranks[1].detail


def test_fenced_anywhere_stops_the_operation_without_compensating() -> None:
    core = OperationCore(weight_sync(), (0, 1), op_id="op", fence=5)
    sent = drive(core, {("apply", "update", 0): StepOutcome.FENCED})
    assert sent == ["apply:pause:0,1", "apply:update:0,1"]
    res = core.result()
    assert res.state is _O.SUPERSEDED and res.superseded == (0, 1)


def test_commit_keys_fence_and_progress() -> None:
    events: list[ProgressEvent] = []
    core = OperationCore(weight_sync(), (3, 4), op_id="op1", fence=9, observer=events.append)
    drive(core, {})
    assert [d.key for d in core.dispatches] == ["op1:pause", "op1:update", "op1:resume"]
    assert {d.fence for d in core.dispatches} == {9}
    assert core.result().ok and core.result().committed == (3, 4)
    assert [(e.rank, e.step, e.state) for e in events if e.rank == 3] == [
        (3, "pause", _R.APPLYING), (3, "pause", _R.APPLIED),
        (3, "update", _R.APPLYING), (3, "update", _R.APPLIED),
        (3, "resume", _R.APPLYING), (3, "resume", _R.APPLIED), (3, "resume", _R.COMMITTED)]


def test_misuse_is_refused() -> None:
    core = OperationCore(weight_sync(), (0, 1), op_id="op", fence=1)
    with pytest.raises(ValueError):
        core.record(0, StepOutcome.OK)
    core.next_dispatch()
    with pytest.raises(RuntimeError):
        core.next_dispatch()
    core.record(0, StepOutcome.OK)
    with pytest.raises(ValueError):
        core.record(0, StepOutcome.OK)
    with pytest.raises(RuntimeError):
        core.result()
    with pytest.raises(ValueError):
        OperationCore(weight_sync(), (), op_id="op", fence=1)
    with pytest.raises(ValueError):
        OperationCore(weight_sync(), (0,), op_id="op", fence=0)
    with pytest.raises(ValueError):
        OperationPlan("empty", ())
    with pytest.raises(ValueError):
        OperationPlan("dup", (OperationStep("a", "m"), OperationStep("a", "n")))
    assert IllegalTransition  # transitions go through the tables (see test_states)


def test_fences_increase() -> None:
    a, b = new_fence(), new_fence()
    assert b > a > 0
    assert new_operation_id("x", a) != new_operation_id("x", b)
