"""What fault injection is told (Fault, Partition, FaultPlan) and what it decides (Verdict,
Injection).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, TypeVar

from ctlwire.transports.envelope import Envelope, Heartbeat, Reply, Request

__all__ = [
    "KINDS",
    "Action",
    "Direction",
    "Fault",
    "FaultPlan",
    "Injection",
    "Partition",
    "Verdict",
    "envelope_kind",
]

Action = Literal["drop", "duplicate", "delay", "reorder"]
Direction = Literal["send", "receive"]
KINDS = frozenset({"request", "reply", "heartbeat"})
_ACTIONS = ("drop", "duplicate", "delay", "reorder")
_DIRECTIONS = ("send", "receive", "both")


def envelope_kind(envelope: Envelope) -> str:
    """``"request"``, ``"reply"`` or ``"heartbeat"``."""
    t = type(envelope)
    if t is Request:
        return "request"
    if t is Reply:
        return "reply"
    if t is Heartbeat:
        return "heartbeat"
    raise TypeError(f"not an envelope: {envelope!r}")


def _envelope_id(envelope: Envelope) -> int:
    return envelope.seq if isinstance(envelope, Heartbeat) else envelope.id


@dataclass(frozen=True)
class Fault:
    """One rule: ``action`` on frames matching ``direction``, ``kinds``, ``ranks``
    and the window ``[start, end)`` (seconds since the wrapper was entered).

    Fires on every ``every``-th matching frame of a link (0: never by count)
    and/or with ``probability``. ``delay`` waits uniformly in
    ``[min_delay, max_delay]``; ``duplicate`` adds ``copies`` extra copies;
    ``reorder`` holds the frame until the next one on its link has passed, at
    most ``hold`` seconds. Build with :meth:`drop`, :meth:`duplicate`,
    :meth:`delay`, :meth:`reorder`.
    """

    action: Action
    probability: float = 0.0
    every: int = 0
    direction: Literal["send", "receive", "both"] = "both"
    kinds: frozenset[str] | None = None
    ranks: frozenset[int] | None = None
    start: float = 0.0
    end: float = math.inf
    min_delay: float = 0.0
    max_delay: float = 0.0
    copies: int = 1
    hold: float = 0.05

    def __post_init__(self) -> None:
        if self.action not in _ACTIONS:
            raise ValueError(f"unknown fault action {self.action!r}")
        if self.direction not in _DIRECTIONS:
            raise ValueError(f"direction must be send, receive or both, not {self.direction!r}")
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError("probability must be within [0, 1]")
        if self.every < 0:
            raise ValueError("every must be >= 0")
        if self.probability == 0.0 and self.every == 0:
            raise ValueError("a fault needs a probability > 0 or every >= 1")
        if self.kinds is not None:
            kinds = frozenset(self.kinds)
            if not kinds <= KINDS:
                raise ValueError(f"unknown envelope kinds {sorted(kinds - KINDS)}")
            object.__setattr__(self, "kinds", kinds)
        if self.ranks is not None:
            object.__setattr__(self, "ranks", frozenset(self.ranks))
        if not 0.0 <= self.min_delay <= self.max_delay:
            raise ValueError("delays must satisfy 0 <= min_delay <= max_delay")
        if self.copies < 1 or self.hold < 0 or self.start > self.end:
            raise ValueError("copies must be >= 1, hold >= 0 and start <= end")

    @classmethod
    def drop(cls, probability: float = 0.0, *, every: int = 0,
             direction: Literal["send", "receive", "both"] = "both",
             kinds: Iterable[str] | None = None, ranks: Iterable[int] | None = None,
             start: float = 0.0, end: float = math.inf) -> Fault:
        """Lose matching frames."""
        return cls("drop", probability, every, direction, _fs(kinds), _fs(ranks), start, end)

    @classmethod
    def duplicate(cls, probability: float = 0.0, *, every: int = 0, copies: int = 1,
                  direction: Literal["send", "receive", "both"] = "both",
                  kinds: Iterable[str] | None = None, ranks: Iterable[int] | None = None,
                  start: float = 0.0, end: float = math.inf) -> Fault:
        """Deliver matching frames ``1 + copies`` times."""
        return cls("duplicate", probability, every, direction, _fs(kinds), _fs(ranks), start,
                   end, copies=copies)

    @classmethod
    def delay(cls, min_delay: float, max_delay: float | None = None, *,
              probability: float = 1.0, every: int = 0,
              direction: Literal["send", "receive", "both"] = "both",
              kinds: Iterable[str] | None = None, ranks: Iterable[int] | None = None,
              start: float = 0.0, end: float = math.inf) -> Fault:
        """Deliver matching frames after ``uniform(min_delay, max_delay)`` seconds."""
        hi = min_delay if max_delay is None else max_delay
        return cls("delay", probability, every, direction, _fs(kinds), _fs(ranks), start, end,
                   min_delay=min_delay, max_delay=hi)

    @classmethod
    def reorder(cls, probability: float = 0.0, *, every: int = 0, hold: float = 0.05,
                direction: Literal["send", "receive", "both"] = "both",
                kinds: Iterable[str] | None = None, ranks: Iterable[int] | None = None,
                start: float = 0.0, end: float = math.inf) -> Fault:
        """Let the next frame on the link overtake matching frames."""
        return cls("reorder", probability, every, direction, _fs(kinds), _fs(ranks), start,
                   end, hold=hold)

    def matches(self, direction: str, rank: int, kind: str, t: float) -> bool:
        return ((self.direction == "both" or self.direction == direction)
                and (self.kinds is None or kind in self.kinds)
                and (self.ranks is None or rank in self.ranks)
                and self.start <= t < self.end)


_T = TypeVar("_T")


def _fs(values: Iterable[_T] | None) -> frozenset[_T] | None:
    return None if values is None else frozenset(values)


@dataclass(frozen=True)
class Partition:
    """``rank`` is cut off (both ways, heartbeats too) during ``[start, end)``,
    seconds since the wrapper was entered. ``notify=True`` also reports the
    link as disconnected at ``start`` (a closed connection rather than a
    silent one; client side only)."""

    rank: int
    start: float = 0.0
    end: float = math.inf
    notify: bool = False


@dataclass(frozen=True)
class FaultPlan:
    """The rules, the partition schedule, an optional close time and the seed."""

    faults: tuple[Fault, ...] = ()
    partitions: tuple[Partition, ...] = ()
    close_at: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "faults", tuple(self.faults))
        object.__setattr__(self, "partitions", tuple(self.partitions))


@dataclass(frozen=True, slots=True)
class Injection:
    """One injected fault: when, on which link, to which frame (its index on
    the link, its envelope kind and id) and what."""

    time: float
    direction: str
    rank: int
    index: int
    kind: str
    envelope_id: int
    action: str
    detail: float = 0.0

    def key(self) -> tuple[str, int, int, str, str, float]:
        """Link, frame index, kind, action and detail: equal for equal seeds and
        frame sequences (envelope ids embed a random incarnation)."""
        return (self.direction, self.rank, self.index, self.kind, self.action,
                round(self.detail, 9))


@dataclass(frozen=True, slots=True)
class Verdict:
    """A frame's fate: one delivery per entry of ``delays`` (none: lost), or
    held for reordering (``hold`` seconds at most) when ``hold`` is set."""

    delays: tuple[float, ...]
    hold: float | None = None
    partitioned: bool = False


_PASS = Verdict((0.0,))
