"""What the interleaving explorer explores (Scenario, CallerSpec) and what it reports
(ExplorationResult, Counterexample, InvariantViolation).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import msgspec

from ctlwire.kernel.core.fan_out_policy import Policy
from ctlwire.kernel.errors import CtlwireError

__all__ = [
    "CHECKS",
    "EVERY_KIND",
    "CallerSpec",
    "CancelMode",
    "Counterexample",
    "ExplorationResult",
    "InvariantViolation",
    "ReplayError",
    "ReplyMode",
    "Scenario",
    "pipelined_scenarios",
    "standard_scenarios",
]

CHECKS: tuple[str, ...] = ("fifo", "exclusive", "order", "shared", "handoff", "registry",
                           "replies", "outcomes", "cleanup", "progress")
"""The named checks, in order of preference between equally short counterexamples."""

_PRIORITY = {name: i for i, name in enumerate((*CHECKS, "crash"))}
_NAMES = "ABCD"
_NIL = msgspec.Raw(b"\xc0")
_METHOD = "m"
_KEY = "k"  # the one key every watching caller shares
_ENGINE_INCARNATION = 1


# -- scenarios -------------------------------------------------------------------------


class ReplyMode(Enum):
    """When a caller's reply (one per rank) reaches the client."""

    NORMAL = "normal"        # once, at any time after its frame left
    DUPLICATE = "duplicate"  # once, then possibly once more (covers NORMAL)
    LATE = "late"            # only after the caller's deadline passed or it finished
    NEVER = "never"          # never


class CancelMode(Enum):
    """When a caller may be cancelled."""

    NEVER = "never"
    QUEUED = "queued"        # while waiting for admission, ticket still queued
    ADMITTED = "admitted"    # once its ticket is admitted (even before it resumed)
    ANY = "any"              # both


@dataclass(frozen=True)
class CallerSpec:
    """What may happen to one caller. Every event allowed here is optional."""

    reply: ReplyMode = ReplyMode.NORMAL
    reply_ok: bool = True      # False: the engine answers with an error
    timeout: bool = False      # the caller's deadline may pass
    cancel: CancelMode = CancelMode.NEVER
    raises: bool = False       # the admitted holder may raise

    def describe(self) -> str:
        parts = [f"reply={self.reply.value}"]
        if not self.reply_ok:
            parts.append("remote-error")
        if self.timeout:
            parts.append("timeout")
        if self.cancel is not CancelMode.NEVER:
            parts.append(f"cancel={self.cancel.value}")
        if self.raises:
            parts.append("raises")
        return ",".join(parts)


EVERY_KIND = CallerSpec(reply=ReplyMode.DUPLICATE, timeout=True, cancel=CancelMode.ANY,
                        raises=True)
"""Every caller event at once: reply (any time, also late), duplicate, timeout,
cancellation anywhere, holder raising."""


@dataclass(frozen=True)
class Scenario:
    """k callers (1..4, named A, B, C, D in the order given) of one queueing
    mailbox fanning out to ``ranks`` ranks (1 or 2) under ``policy``, up to
    ``depth`` requests in flight (the mailbox's pipeline depth, 1 to 4).

    ``engine_loss``: the last rank may become unroutable (``unplug R``) and may
    be declared lost (``lose R``), independently, at any time. ``max_tombstones``
    is the registry's bound (small, so eviction is exercised).

    ``mailbox=False``: no mailbox -- the callers run concurrently, as
    ``ControlClient.call`` and ``fan_out(mode="concurrent")`` do (their first
    step is ``register``; cancellation ``QUEUED`` never fires, ``ADMITTED``
    and ``ANY`` fire anywhere), so the registry holds several requests at once.

    ``watching=True`` (with ``mailbox=False``): the callers share requests through
    a :class:`~ctlwire.kernel.primitives.coalescer.Coalescer`, as watching
    fan-outs do: the first step is ``join``, which starts a request (then
    ``send``) or joins the one in flight (then ``wake``); a joiner's own deadline
    ends its own wait, the starter's expires the request.
    """

    callers: tuple[CallerSpec, ...]
    ranks: int = 1
    policy: Policy = Policy.ALL
    engine_loss: bool = False
    max_tombstones: int = 2
    mailbox: bool = True
    watching: bool = False
    depth: int = 1
    name: str = ""

    def __post_init__(self) -> None:
        if not 1 <= len(self.callers) <= len(_NAMES):
            raise ValueError(f"a scenario has 1 to {len(_NAMES)} callers")
        if not 1 <= self.depth <= len(_NAMES):
            raise ValueError(f"a scenario's depth is 1 to {len(_NAMES)}")
        if self.depth > 1 and not self.mailbox:
            raise ValueError("a pipeline depth needs a mailbox")
        if not 1 <= self.ranks <= 2:
            raise ValueError("a scenario has 1 or 2 ranks")
        if self.watching and self.mailbox:
            raise ValueError("a watching scenario has no mailbox: pass mailbox=False")
        for i, spec in enumerate(self.callers):
            if spec.reply in (ReplyMode.NEVER, ReplyMode.LATE) and not spec.timeout:
                raise ValueError(f"caller {_NAMES[i]}: reply={spec.reply.value} needs "
                                 "timeout=True (otherwise it legitimately waits forever)")
        if not self.name:
            object.__setattr__(self, "name", self.describe())

    @classmethod
    def uniform(cls, k: int, spec: CallerSpec = EVERY_KIND, **kwargs: Any) -> Scenario:
        """k callers with the same spec."""
        return cls(callers=(spec,) * k, **kwargs)

    def describe(self) -> str:
        specs = [s.describe() for s in self.callers]
        who = (f"{len(specs)} x [{specs[0]}]" if len(set(specs)) == 1
               else " ".join(f"{_NAMES[i]}[{s}]" for i, s in enumerate(specs)))
        extra = f", {self.ranks} ranks {self.policy.value}" if self.ranks > 1 else ""
        if self.depth > 1:
            extra += f", depth {self.depth}"
        if self.engine_loss:
            extra += ", engine loss"
        if self.watching:
            extra += ", watching"
        elif not self.mailbox:
            extra += ", no mailbox"
        return f"k={len(specs)}{extra}: {who}"


def standard_scenarios(max_callers: int = 3, max_callers_two_ranks: int = 2) -> list[Scenario]:
    """The scenario family run in CI.

    For k = 1..``max_callers`` callers of a mailbox to one rank: every event
    kind for every caller; the same without deadlines (so a lost wake-up shows
    as a hang rather than as a timeout); replies that never come, or come only
    late and as errors, mixed with every event kind; engine loss (the rank
    unroutable and/or declared lost, at any time); concurrent callers
    without a mailbox (several requests in the registry at once: every event
    kind up to two callers; deadlines, cancellation and raising for three); and
    watching callers sharing requests, the same way and without deadlines.
    For k = 1..``max_callers_two_ranks`` callers of a mailbox to two ranks:
    every event kind under policy ``all`` and under ``first``; engine loss of
    one rank.
    """
    out: list[Scenario] = []
    no_deadline = CallerSpec(reply=ReplyMode.DUPLICATE, cancel=CancelMode.ANY, raises=True)
    never = CallerSpec(reply=ReplyMode.NEVER, timeout=True, cancel=CancelMode.ANY, raises=True)
    late = CallerSpec(reply=ReplyMode.LATE, reply_ok=False, timeout=True,
                      cancel=CancelMode.QUEUED)
    loss = CallerSpec(timeout=True, cancel=CancelMode.ADMITTED)
    for k in range(1, max_callers + 1):
        out.append(Scenario.uniform(k, EVERY_KIND, name=f"k={k} every event kind"))
        out.append(Scenario.uniform(k, no_deadline, name=f"k={k} no deadlines"))
        mixed = tuple((never, late, EVERY_KIND, never)[i] for i in range(k))
        out.append(Scenario(mixed, name=f"k={k} never / late error / every kind"))
        out.append(Scenario.uniform(k, loss, engine_loss=True, name=f"k={k} engine loss"))
        concurrent = EVERY_KIND if k <= 2 else CallerSpec(timeout=True, cancel=CancelMode.ANY,
                                                          raises=True)
        out.append(Scenario.uniform(k, concurrent, mailbox=False,
                                    name=f"k={k} no mailbox (concurrent calls)"))
        out.append(Scenario.uniform(k, concurrent, mailbox=False, watching=True,
                                    name=f"k={k} watching (shared requests)"))
        out.append(Scenario.uniform(k, no_deadline, mailbox=False, watching=True,
                                    name=f"k={k} watching, no deadlines"))
        if k > 1:  # the others wait without deadlines, and cannot give up: no hang
            leaving = (CallerSpec(cancel=CancelMode.ANY, raises=True),
                       *(CallerSpec(),) * (k - 1))
            out.append(Scenario(leaving, mailbox=False, watching=True,
                                name=f"k={k} watching, one caller may leave"))
    for k in range(1, max_callers_two_ranks + 1):
        out.append(Scenario.uniform(k, EVERY_KIND, ranks=2,
                                    name=f"k={k} 2 ranks all, every event kind"))
        out.append(Scenario.uniform(k, EVERY_KIND, ranks=2, policy=Policy.FIRST,
                                    name=f"k={k} 2 ranks first, every event kind"))
        out.append(Scenario.uniform(k, loss, ranks=2, engine_loss=True,
                                    name=f"k={k} 2 ranks, engine loss"))
        if k > 1:
            leaving = (CallerSpec(cancel=CancelMode.ANY, raises=True), *(CallerSpec(),) * (k - 1))
            out.append(Scenario(leaving, ranks=2, mailbox=False, watching=True,
                                name=f"k={k} 2 ranks, watching, one caller may leave"))
    return out


def pipelined_scenarios() -> list[Scenario]:
    """The ordered-pipelining family run in CI: a mailbox with depth 2 to 4 (several
    requests in flight, sent, received and completed in admission order), over
    arrivals, starts, hand-offs, replies in any order, cancellations, deadlines and
    rank loss. (Names say which are explored with the reduction: ``reduced``.)"""
    no_deadline = CallerSpec(reply=ReplyMode.DUPLICATE, cancel=CancelMode.ANY, raises=True)
    loss = CallerSpec(timeout=True, cancel=CancelMode.ADMITTED)
    return [
        Scenario.uniform(2, EVERY_KIND, depth=2, name="k=2 depth 2, every event kind"),
        Scenario.uniform(3, no_deadline, depth=3, name="k=3 depth 3, no deadlines"),
        Scenario.uniform(2, EVERY_KIND, ranks=2, depth=2,
                         name="k=2 depth 2, 2 ranks all, every event kind"),
        Scenario.uniform(2, EVERY_KIND, ranks=2, depth=2, policy=Policy.FIRST,
                         name="k=2 depth 2, 2 ranks first, every event kind"),
        Scenario.uniform(2, loss, ranks=2, depth=2, engine_loss=True,
                         name="k=2 depth 2, 2 ranks, engine loss"),
        Scenario.uniform(3, EVERY_KIND, depth=2, name="k=3 depth 2, every event kind, reduced"),
        Scenario.uniform(3, EVERY_KIND, depth=3, name="k=3 depth 3, every event kind, reduced"),
        Scenario.uniform(3, loss, depth=3, engine_loss=True,
                         name="k=3 depth 3, engine loss, reduced"),
        Scenario.uniform(4, CallerSpec(cancel=CancelMode.QUEUED), depth=4,
                         name="k=4 depth 4, queued cancels, reduced"),
    ]


# -- violations and results ------------------------------------------------------------


class InvariantViolation(AssertionError):
    """A check failed. ``check`` is one of :data:`CHECKS` or ``"crash"``."""

    def __init__(self, check: str, detail: str) -> None:
        self.check = check
        self.detail = detail
        super().__init__(f"[{check}] {detail}")

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, InvariantViolation) and other.check == self.check
                and other.detail == self.detail)

    def __hash__(self) -> int:
        return hash((self.check, self.detail))


class ReplayError(CtlwireError, ValueError):
    """A replayed event was not enabled at its point of the sequence."""


@dataclass(frozen=True)
class Counterexample:
    """A shortest failing event sequence, and what each event did."""

    scenario: Scenario
    events: tuple[str, ...]
    violation: InvariantViolation
    trace: tuple[str, ...]
    others: tuple[tuple[str, tuple[str, ...]], ...] = ()  # other checks failing as early

    def __len__(self) -> int:
        return len(self.events)

    def format(self) -> str:
        """A report whose ``events = [...]`` line can be pasted into a test."""
        lines = [f"counterexample, {len(self.events)} events, scenario {self.scenario.name!r}",
                 f"  violation: {self.violation}",
                 "  events = [" + ", ".join(f'"{e}"' for e in self.events) + "]"]
        width = max((len(e) for e in self.events), default=0)
        for i, (event, what) in enumerate(zip(self.events, self.trace, strict=False), 1):
            lines.append(f"  {i:3d}. {event:<{width}}  {what}")
        for what in self.trace[len(self.events):]:
            lines.append(f"       {'':<{width}}  {what}")
        for check, events in self.others:
            lines.append(f"  as short, also fails [{check}]: [" +
                         ", ".join(f'"{e}"' for e in events) + "]")
        return "\n".join(lines)


@dataclass
class ExplorationResult:
    """What :func:`explore` checked: every complete interleaving of ``scenario``
    (``interleavings``), each distinct state once (``states``), over
    ``transitions`` executed events; ``counterexample`` is None when every check
    held everywhere."""

    scenario: Scenario
    interleavings: int = 0
    states: int = 0
    transitions: int = 0
    max_depth: int = 0
    seconds: float = 0.0
    counterexample: Counterexample | None = None
    checks: tuple[str, ...] = CHECKS
    reduced: bool = False

    @property
    def ok(self) -> bool:
        return self.counterexample is None

    def summary(self) -> str:
        cx = self.counterexample
        status = "ok" if cx is None else f"FAILED {cx.violation}"
        kind = " (reduced)" if self.reduced else ""
        return (f"{self.scenario.name}: {self.interleavings:,} interleavings{kind}, "
                f"{self.states:,} states, {self.transitions:,} transitions, "
                f"depth {self.max_depth}, {self.seconds:.2f} s: {status}")
