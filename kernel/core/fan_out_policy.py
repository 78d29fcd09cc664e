"""When a request to several ranks is decided: ``all``, ``quorum`` or ``first``.

* ``all`` — every rank settled (answered, or failed locally). Done when at
  least one rank answered, Failed when none could.
* ``quorum`` — Done once more than half the ranks answered ok; Failed as soon
  as that can no longer happen.
* ``first`` — Done at the first ok answer; Failed when every rank settled
  without one.

A single-rank ``call`` is ``all`` over one rank. Decisions are O(1) from three
counters kept by the registry.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Decision", "Policy", "decide"]


class Policy(Enum):
    ALL = "all"
    QUORUM = "quorum"
    FIRST = "first"


class Decision(Enum):
    PENDING = "pending"
    COMPLETE = "complete"
    FAIL = "fail"


def decide(policy: Policy, n: int, ok: int, answered: int, settled: int) -> Decision:
    """The decision for ``n`` ranks of which ``settled`` are settled, ``answered``
    of those by a reply (ok or remote error) and ``ok`` by an ok reply."""
    if policy is Policy.ALL:
        if settled < n:
            return Decision.PENDING
        return Decision.COMPLETE if answered else Decision.FAIL
    if policy is Policy.FIRST:
        if ok:
            return Decision.COMPLETE
        return Decision.FAIL if settled >= n else Decision.PENDING
    need = n // 2 + 1
    if ok >= need:
        return Decision.COMPLETE
    if ok + (n - settled) < need:
        return Decision.FAIL
    return Decision.PENDING
