"""Exhaustive exploration of the operation coordinator (:class:`OperationCore`).

The interleaving explorer (:mod:`ctlwire.testing.interleaving`) enumerates the
orders in which callers, replies and deadlines can meet in the request
registry and mailbox; this module does the same for a multi-rank operation.
For a plan and k ranks (k <= 3 in the tests) it drives the real core through
every path where, at every dispatch (forward step or compensation), every
rank's outcome is any of:

    ok              the step applied
    error           the engine answered an error: it did not apply
    not_delivered   never handed over: it did not apply
    unknown+        lost or timed out, and it really applied
    unknown-        lost or timed out, and it really did not
    fenced          a newer operation holds the rank

in every arrival order (or rank order, ``every_order=False``), with a model of
what really changed on each engine. Checked at every dispatch: nothing is
sent after a rank fenced the operation out; no forward step after a fault; a
forward step only after the previous one applied on every rank; keys and
fencing tokens are the operation's; a compensation only goes to a rank where
its step applied or may have, newest first. Checked at the end: every rank is
Committed, Compensated, Aborted, Quarantined or Superseded; committed on one
rank means committed (and really applied) on all; a rank reported Compensated
or Aborted carries no change that a compensation exists for; the operation's
state matches its ranks'; every faulty rank is named in ``failed_ranks``; the
progress stream ends where the result says.

A violation raises :class:`OperationViolation` with the path that led to it::

    python -m ctlwire.testing.operation_explorer --ranks 3
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ctlwire.kernel.core.operation_core import Dispatch, OperationCore, StepOutcome
from ctlwire.kernel.core.operation_plan import (
    OperationPlan,
    OperationStep,
    StepCall,
    step_key,
)
from ctlwire.kernel.core.operation_result import ProgressEvent
from ctlwire.states import OperationState, RankState

__all__ = ["CHOICES", "OperationViolation", "explore", "main", "weight_sync_plan"]

_R = RankState
_O = OperationState

#: (what the core is told, whether the engine really applied it)
CHOICES: tuple[tuple[StepOutcome, bool], ...] = (
    (StepOutcome.OK, True),
    (StepOutcome.ERROR, False),
    (StepOutcome.NOT_DELIVERED, False),
    (StepOutcome.UNKNOWN, True),
    (StepOutcome.UNKNOWN, False),
    (StepOutcome.FENCED, False),
)


def weight_sync_plan(quarantine_on_error: bool = False) -> OperationPlan:
    """pause (undo: resume) -> update (undo: restore) -> resume."""
    return OperationPlan("weight-sync", (
        OperationStep("pause", "pause", compensation=StepCall("resume")),
        OperationStep("update", "update_weights", 7, compensation=StepCall("restore_weights", 6),
                      quarantine_on_error=quarantine_on_error),
        OperationStep("resume", "resume"),
    ))


class OperationViolation(AssertionError):
    """An invariant failed; ``path`` lists the outcomes that led there."""

    def __init__(self, message: str, path: Sequence[str]) -> None:
        self.path = list(path)
        super().__init__(message + "\n  path: " + " | ".join(self.path))


@dataclass
class _World:
    core: OperationCore
    applied: dict[int, set[int]]                 # what really changed on each engine
    maybe: dict[int, set[int]]                   # steps the core was told ok or unknown
    fault: bool = False                          # some rank had a non-ok apply outcome
    fenced: bool = False
    faulty_ranks: set[int] = field(default_factory=set)
    undo_order: dict[int, list[int]] = field(default_factory=dict)
    events: list[ProgressEvent] = field(default_factory=list)
    path: list[str] = field(default_factory=list)

    def clone(self) -> _World:
        events = list(self.events)
        core = self.core.clone()
        core.observer = events.append
        return _World(core, {r: set(s) for r, s in self.applied.items()},
                      {r: set(s) for r, s in self.maybe.items()}, self.fault, self.fenced,
                      set(self.faulty_ranks), {r: list(v) for r, v in self.undo_order.items()},
                      events, list(self.path))

    def key(self) -> tuple[Any, ...]:
        return (self.core.state_key(), self.fenced, self.fault,
                tuple(sorted((r, tuple(sorted(s))) for r, s in self.applied.items())),
                tuple(sorted((r, tuple(sorted(s))) for r, s in self.maybe.items())),
                tuple(sorted(self.faulty_ranks)))

    def fail(self, message: str) -> None:
        raise OperationViolation(message, self.path)


def _check_dispatch(w: _World, d: Dispatch) -> None:
    core = w.core
    if w.fenced:
        w.fail(f"dispatch {d.key} after a rank fenced the operation out")
    if d.fence != core.fence or d.op_id != core.op_id:
        w.fail(f"dispatch {d.key} carries the wrong fence or operation")
    index = core.plan.index(d.step)
    if d.phase == "apply":
        if w.fault:
            w.fail(f"forward step {d.step} dispatched after a fault")
        if d.ranks != core.ranks or d.key != step_key(core.op_id, d.step):
            w.fail(f"forward step {d.step}: ranks {d.ranks}, key {d.key}")
        if index > 0 and any(index - 1 not in w.maybe[r] for r in d.ranks):
            w.fail(f"step {d.step} sent before the previous applied everywhere")
        return
    if d.key != step_key(core.op_id, d.step, undo=True):
        w.fail(f"compensation key {d.key}")
    comp = core.plan.steps[index].compensation
    if comp is None or d.method != comp.method:
        w.fail(f"compensation of {d.step} sends {d.method}")
    for r in d.ranks:
        if index not in w.maybe[r]:
            w.fail(f"undo of {d.step} sent to rank {r}, where it never applied")
        order = w.undo_order.setdefault(r, [])
        if order and order[-1] <= index:
            w.fail(f"rank {r}: undo order {[*order, index]} is not newest first")
        order.append(index)


def _check_final(w: _World) -> None:
    core = w.core
    if not core.done:
        w.fail(f"no dispatch left but the operation is {core.state}")
    res = core.result()
    states = {r: rep.state for r, rep in res.ranks.items()}
    ends = {_R.COMMITTED, _R.COMPENSATED, _R.ABORTED, _R.QUARANTINED, _R.SUPERSEDED}
    if set(states) != set(core.ranks) or not set(states.values()) <= ends:
        w.fail(f"ranks not in an end state: {states}")
    committed = [r for r, s in states.items() if s is _R.COMMITTED]
    if committed and len(committed) != len(states):
        w.fail(f"mixed: committed {committed} but {states}")
    if res.state is _O.COMMITTED:
        n = len(core.plan.steps)
        if committed != list(core.ranks) or any(w.applied[r] != set(range(n)) for r in committed):
            w.fail(f"committed but applied {w.applied}")
    for r, s in states.items():
        if s in (_R.COMPENSATED, _R.ABORTED):
            left = {j for j in w.applied[r] if core.plan.steps[j].compensation is not None}
            if left:
                w.fail(f"rank {r} reported {s.name} but still has {left} applied")
    if res.state is _O.ABORTED and not set(states.values()) <= {_R.COMPENSATED, _R.ABORTED}:
        w.fail(f"aborted but {states}")
    if res.state is _O.DEGRADED and _R.QUARANTINED not in states.values():
        w.fail(f"degraded without a quarantined rank: {states}")
    if res.state is _O.SUPERSEDED and _R.SUPERSEDED not in states.values():
        w.fail(f"superseded without a superseded rank: {states}")
    if (res.state is not _O.COMMITTED and not w.fenced
            and not w.faulty_ranks <= set(res.failed_ranks)):
        w.fail(f"faulty ranks {w.faulty_ranks} not all named in {res.failed_ranks}")
    last = {ev.rank: ev.state for ev in w.events}
    if last != states:
        w.fail(f"progress ended at {last}, result says {states}")


def explore(plan: OperationPlan, k: int, core_cls: type[OperationCore] = OperationCore,
            choices: Sequence[tuple[StepOutcome, bool]] = CHOICES, *,
            every_order: bool = True) -> int:
    """Every path of ``plan`` on ``k`` ranks; the number of distinct states visited.

    Raises :class:`OperationViolation` on the first broken invariant."""
    ranks = tuple(range(k))
    events: list[ProgressEvent] = []
    core = core_cls(plan, ranks, op_id="op", fence=7, observer=events.append)
    root = _World(core, {r: set() for r in ranks}, {r: set() for r in ranks}, events=events)
    seen: set[tuple[Any, ...]] = set()
    stack = [root]
    while stack:
        w = stack.pop()
        key = w.key()
        if key in seen:
            continue
        seen.add(key)
        d = w.core.inflight
        if d is None:
            d = w.core.next_dispatch()
            if d is None:
                _check_final(w)
                continue
            _check_dispatch(w, d)
        index = w.core.plan.index(d.step)
        waiting = [r for r in d.ranks if not w.core.has_outcome(r)]
        for rank in waiting if every_order else waiting[:1]:
            for outcome, really in choices:
                child = w.clone()
                label = outcome.value + ("" if outcome is not StepOutcome.UNKNOWN
                                         else "+" if really else "-")
                child.path.append(f"{d.phase}:{d.step}@{rank}={label}")
                if d.phase == "apply":
                    if really:
                        child.applied[rank].add(index)
                    if outcome in (StepOutcome.OK, StepOutcome.UNKNOWN):
                        child.maybe[rank].add(index)
                    if outcome not in (StepOutcome.OK, StepOutcome.FENCED):
                        child.fault = True
                        child.faulty_ranks.add(rank)
                elif really and outcome in (StepOutcome.OK, StepOutcome.UNKNOWN):
                    child.applied[rank].discard(index)  # the undo ran
                if outcome is StepOutcome.FENCED:
                    child.fenced = True
                child.core.record(rank, outcome, f"{outcome.value} at {d.key}")
                stack.append(child)
    return len(seen)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ctlwire.testing.operation_explorer")
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--quarantine-on-error", action="store_true")
    p.add_argument("--rank-order", action="store_true",
                   help="outcomes of a dispatch in rank order only (faster)")
    args = p.parse_args(argv)
    plan = weight_sync_plan(args.quarantine_on_error)
    try:
        n = explore(plan, args.ranks, every_order=not args.rank_order)
    except OperationViolation as exc:
        print(f"VIOLATION: {exc}")
        return 1
    print(f"{plan.name} on {args.ranks} ranks: {n} states, every invariant holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
