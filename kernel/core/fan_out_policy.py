"""When a request to several ranks is decided: ``all``, ``quorum`` or ``first``.

* ``all`` — every rank settled (answered, or failed locally). Done when at
  least one rank answered, Failed when none could.
* ``quorum`` — Done once more than half the ranks answered ok; Failed as soon
  as that can no longer happen.
* ``first`` — Done at the first ok answer; Failed when every rank settled
  without one.

A single-rank ``call`` is ``all`` over one rank. Decisions are O(1) from three
counters kept by the registry.

How concurrent callers of one method are admitted (a fan-out's ``mode``) defaults
by the method's kind (:class:`MethodKinds`): a read-only method ``watching``,
every other ``queueing``.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import Literal

__all__ = ["Decision", "FanOutMode", "MethodKinds", "Policy", "decide"]

FanOutMode = Literal["queueing", "watching", "concurrent"]


class MethodKinds:
    """The methods a client knows to be read-only, and the fan-out mode each
    method defaults to.

    A read-only method (declared on the engine with ``read_only=True``; the
    client is told which, with :meth:`declare_read_only`, it does not ask)
    defaults to ``watching``: concurrent callers with the same request share one
    in-flight request, so fifty status pollers cost one request per rank instead
    of a queue of fifty behind each other. Every other method defaults to
    ``queueing`` (first come, first served, one in flight). A caller's explicit
    ``mode`` always wins."""

    def __init__(self, read_only: Iterable[str] = ()) -> None:
        self.read_only: set[str] = set(read_only)

    def declare_read_only(self, *methods: str) -> None:
        """Treat ``methods`` as read-only from now on."""
        self.read_only.update(methods)

    def default_mode(self, method: str) -> FanOutMode:
        """``watching`` for a read-only method, else ``queueing``."""
        return "watching" if method in self.read_only else "queueing"


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
