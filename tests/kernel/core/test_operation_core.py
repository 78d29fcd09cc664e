"""The sans-IO operation coordinator, explored exhaustively (kernel.operation_explorer).

With k <= 3 ranks and, for every dispatch, every rank's outcome chosen among
ok / error / not delivered / unknown (which really applied, or really did not)
/ fenced, in every arrival order, the explorer checks that every rank ends
Committed, Compensated, Aborted, Quarantined or Superseded as the result says,
and that no rank the result calls Compensated or Aborted still carries a change
(an engine model tracks what really applied). A deliberately broken core is
caught, so the explorer can fail.
"""

from __future__ import annotations

from typing import Any

import pytest

from ctlwire.kernel.core.operation_core import OperationCore, StepOutcome
from ctlwire.kernel.core.operation_plan import (
    OperationPlan,
    OperationStep,
    StepCall,
    new_fence,
    new_operation_id,
)
from ctlwire.kernel.core.operation_result import ProgressEvent
from ctlwire.states import IllegalTransition, OperationState, RankState
from ctlwire.testing.operation_explorer import OperationViolation, explore, main

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
    with pytest.raises(OperationViolation, match="still has"):
        explore(weight_sync(), 2, ForgetsUnknownOutcomes)


class CommitsDespiteErrors(OperationCore):
    """Broken: a step that erred on one rank counts as applied everywhere."""

    def record(self, rank: int, outcome: StepOutcome, detail: str = "") -> None:
        if outcome is StepOutcome.ERROR:
            outcome = StepOutcome.OK
        super().record(rank, outcome, detail)


def test_explorer_catches_a_core_that_commits_despite_errors() -> None:
    with pytest.raises(OperationViolation, match=r"committed but applied|still has"):
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


def test_explorer_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--ranks", "2"]) == 0
    assert "every invariant holds" in capsys.readouterr().out


def benign_first() -> OperationPlan:
    """A first step with nothing to undo (a rank that applied only it is just Aborted)."""
    return OperationPlan("read-then-write", (
        OperationStep("drain", "drain"),
        OperationStep("write", "write", compensation=StepCall("unwrite")),
    ))


def test_the_explorer_exercises_every_declared_transition(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ctlwire.kernel.core import operation_core
    from ctlwire.states import OPERATION_RANK_TABLE, OPERATION_TABLE, StateTable

    used: set[tuple[object, object]] = set()

    class Recording(StateTable):  # type: ignore[type-arg]
        def apply(self, state: Any, event: Any, request_id: object | None = None) -> Any:
            used.add((state, event))
            return super().apply(state, event, request_id)

    monkeypatch.setattr(operation_core, "OPERATION_RANK_TABLE",
                        Recording(OPERATION_RANK_TABLE.spec, OPERATION_RANK_TABLE.table))
    monkeypatch.setattr(operation_core, "OPERATION_TABLE",
                        Recording(OPERATION_TABLE.spec, OPERATION_TABLE.table))
    for plan in (weight_sync(), weight_sync(True), with_benign_step(), benign_first()):
        explore(plan, 2, every_order=False)
    # a successor finishing a compensation (not a path of one controller's run)
    core = OperationCore(weight_sync(), (0, 1), op_id="op", fence=5)
    core.finish_compensation({0: ["pause", "update"], 1: ["pause"]}, {0: ["update"]})
    while (d := core.next_dispatch()) is not None:
        for r in d.ranks:
            core.record(r, StepOutcome.OK)
    declared = set(OPERATION_RANK_TABLE.table) | set(OPERATION_TABLE.table)
    assert declared - used == set()  # no edge in the diagrams that the core never takes
