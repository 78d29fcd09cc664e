"""What remains of an operation a controller left undecided, read from the ranks' ledgers.

:func:`recovery_of` is pure: it turns each rank's answer to
``ctlwire.last_operation`` (or ``ctlwire.take_over``) into a :class:`Recovery`,
which :meth:`~ctlwire.kernel.operations.runner.OperationRunner.finish` (and the
deterministic simulation) act on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from ctlwire.kernel.core.operation_plan import OperationPlan
from ctlwire.kernel.engine.operation_ledger import LastOperation

__all__ = ["Recovery", "RecoveryAction", "recovery_of", "unsettled"]


RecoveryAction = Literal["compensate", "roll_forward", "done"]


@dataclass(frozen=True)
class Recovery:
    """The newest operation of a plan the ranks report having applied steps of, and
    what remains of it on each rank (from the ranks' own ledgers).

    ``action``: ``"compensate"`` once some rank ran a compensation (the
    operation can only be undone; ``remaining`` lists, per rank, the steps
    whose compensation is still to run, newest first), ``"roll_forward"`` when
    none did and the plan's last step is missing somewhere (``remaining``: the
    steps still to apply there), ``"done"`` when every rank applied every step.
    ``ranks``: the operation's ranks; ``missing``: those that did not answer.
    :meth:`OperationRunner.finish` does what remains, in one call."""

    op_id: str
    fence: int
    steps: dict[int, tuple[str, ...]]  # per rank: the steps applied there, plan order
    complete: bool = False      # every rank applied the plan's last step
    compensated: bool = False   # some rank ran a compensation: it cannot be replayed forward
    undone: dict[int, tuple[str, ...]] = field(default_factory=dict)
    ranks: tuple[int, ...] = ()
    missing: tuple[int, ...] = ()
    action: RecoveryAction = "done"
    remaining: dict[int, tuple[str, ...]] = field(default_factory=dict)
    taken_over: int = 0  # the fence the ranks were taken over with (0: only read)


def recovery_of(plan: OperationPlan, answers: Mapping[int, LastOperation | Exception]
                ) -> Recovery | None:
    """The :class:`Recovery` of ``plan`` from each rank's ledger answer (an
    exception: the rank did not answer); None when no rank applied a step of it."""
    prefix = f"{plan.name}@"
    lasts = [v for v in answers.values()
             if isinstance(v, LastOperation) and v.op.startswith(prefix)]
    if not lasts:
        return None
    newest = max(lasts, key=lambda v: v.fence)
    mine = {v.rank: v for v in lasts if v.op == newest.op}
    op_ranks = tuple(sorted(set(newest.ranks) | set(mine)))
    missing = tuple(r for r in op_ranks if not isinstance(answers.get(r), LastOperation))
    known = [r for r in op_ranks if r not in missing]
    # a rank that answered with another operation applied nothing of this one
    steps = {r: tuple(mine[r].steps) if r in mine else () for r in known}
    undone = {r: tuple(mine[r].undone) if r in mine else () for r in known}
    names = [s.name for s in plan.steps]
    compensated = any(undone.values())
    complete = all(len(s) == len(names) for s in steps.values())
    action: RecoveryAction
    if compensated:
        action = "compensate"
        remaining = {r: tuple(n for n in reversed(steps[r]) if n not in undone[r]
                              and plan.steps[plan.index(n)].compensation is not None)
                     for r in known}
    elif complete and not missing:
        action, remaining = "done", {r: () for r in known}
    else:
        action = "roll_forward"
        remaining = {r: tuple(names[len(steps[r]):]) for r in known}
    return Recovery(newest.op, max(v.fence for v in mine.values()), steps,
                    complete=complete and not missing, compensated=compensated,
                    undone=undone, ranks=op_ranks, missing=missing, action=action,
                    remaining=remaining)


def unsettled(plan: OperationPlan, last: LastOperation) -> bool:
    """Whether ``last`` is an operation of ``plan`` left mid-way on its rank: steps
    applied, but neither every step (committed) nor every compensation due."""
    names = [s.name for s in plan.steps]
    if not last.op.startswith(f"{plan.name}@") or not last.steps:
        return False
    if list(last.steps) == names and not last.undone:
        return False
    due = [n for n in last.steps if n in names
           and plan.steps[plan.index(n)].compensation is not None]
    return not (last.undone and all(n in last.undone for n in due))
