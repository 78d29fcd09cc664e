"""FaultInjector: decides each frame's fate, deterministically per link given the seed; the
logic both wrappers share.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable

from ctlwire.testing.faults._faults import (
    _PASS,
    Direction,
    FaultPlan,
    Injection,
    Partition,
    Verdict,
    _envelope_id,
    envelope_kind,
)
from ctlwire.transports.envelope import Envelope

__all__ = ["FaultInjector"]

class FaultInjector:
    """Decides the fate of each frame; the logic both wrappers share.

    Start it with a clock (:meth:`start`); times in the plan are relative to
    that moment. :meth:`partition` / :meth:`heal` act at once, on top of the
    plan's schedule.
    """

    def __init__(self, plan: FaultPlan | None = None, *, record: int = 100_000) -> None:
        self.plan = plan or FaultPlan()
        self.counters: dict[str, int] = {}
        self.log: deque[Injection] = deque(maxlen=record)
        self.events: list[tuple[float, str, int]] = []
        self._rngs: dict[tuple[str, int], random.Random] = {}
        self._frames: dict[tuple[str, int], int] = {}
        self._matched: dict[tuple[int, str, int], int] = {}
        self._manual: set[int] = set()
        self._healed: set[int] = set()  # plan partitions (by index) healed by hand
        self._begun: set[int] = set()
        self._ended: set[int] = set()
        self._clock: Callable[[], float] | None = None
        self._t0 = 0.0

    # -- time -------------------------------------------------------------------
    def start(self, clock: Callable[[], float]) -> None:
        """Start the plan's clock (once; later calls are ignored)."""
        if self._clock is None:
            self._clock = clock
            self._t0 = clock()

    @property
    def started(self) -> bool:
        return self._clock is not None

    @property
    def clock(self) -> Callable[[], float] | None:
        """The clock :meth:`start` was given."""
        return self._clock

    def now(self) -> float:
        """Seconds since :meth:`start` (0 before)."""
        return 0.0 if self._clock is None else self._clock() - self._t0

    def count(self, action: str | None = None, direction: str | None = None,
              kind: str | None = None) -> int:
        """The sum of counters matching the given parts of ``action.direction.kind``."""
        total = 0
        for key, n in self.counters.items():
            a, _, rest = key.partition(".")
            d, _, k = rest.partition(".")
            if ((action is None or a == action) and (direction is None or d == direction)
                    and (kind is None or k == kind)):
                total += n
        return total

    def bump(self, key: str, n: int = 1) -> None:
        """Count ``n`` more of ``key`` in :attr:`counters`."""
        self.counters[key] = self.counters.get(key, 0) + n

    # -- partitions -------------------------------------------------------------
    def partition(self, rank: int) -> None:
        """Cut ``rank`` off now, until :meth:`heal`."""
        if rank not in self._manual:
            self._manual.add(rank)
            self.events.append((self.now(), "partition", rank))
            self.bump("partitions_started")

    def heal(self, rank: int) -> None:
        """End every partition of ``rank`` in force now (manual or scheduled)."""
        t = self.now()
        was = self.is_partitioned(rank, t)
        self._manual.discard(rank)
        for i, p in enumerate(self.plan.partitions):
            if p.rank == rank and self._in_force(i, p, t):
                self._healed.add(i)
        if was:
            self.events.append((t, "heal", rank))
            self.bump("partitions_healed")

    def _in_force(self, index: int, p: Partition, t: float) -> bool:
        if index in self._healed or index in self._ended:
            return False
        # the schedule task's word wins over a clock reading a hair early
        return (p.start <= t or index in self._begun) and t < p.end

    def is_partitioned(self, rank: int, t: float | None = None) -> bool:
        """Whether ``rank`` is cut off at ``t`` (default: now)."""
        if rank in self._manual:
            return True
        if t is None:
            t = self.now()
        return any(p.rank == rank and self._in_force(i, p, t)
                   for i, p in enumerate(self.plan.partitions))

    def begin_scheduled(self, index: int, at: float) -> bool:
        """The schedule reached partition ``index``'s start at ``at`` (by its own
        timer): recorded and counted, unless it was healed by hand (False)."""
        if index in self._healed:
            return False
        self._begun.add(index)
        self.events.append((at, "partition", self.plan.partitions[index].rank))
        self.bump("partitions_started")
        return True

    def end_scheduled(self, index: int, at: float) -> bool:
        """The schedule reached partition ``index``'s end at ``at``: recorded and
        counted, unless it was healed by hand (False)."""
        if index in self._healed:
            return False
        self._ended.add(index)
        self.events.append((at, "heal", self.plan.partitions[index].rank))
        self.bump("partitions_healed")
        return True

    @property
    def partitioned(self) -> set[int]:
        """Ranks cut off now."""
        ranks = {p.rank for p in self.plan.partitions} | self._manual
        return {r for r in ranks if self.is_partitioned(r)}

    def schedule(self) -> list[tuple[float, str, int]]:
        """The plan's timed events, in time order: ``(t, "partition"|"heal", index
        of the partition)`` and ``(t, "close", -1)``."""
        out: list[tuple[float, str, int]] = []
        for i, p in enumerate(self.plan.partitions):
            out.append((p.start, "partition", i))
            if p.end != math.inf:
                out.append((p.end, "heal", i))
        if self.plan.close_at is not None:
            out.append((self.plan.close_at, "close", -1))
        out.sort(key=lambda e: e[0])
        return out

    # -- the decision -----------------------------------------------------------
    def _rng(self, link: tuple[str, int]) -> random.Random:
        rng = self._rngs.get(link)
        if rng is None:
            rng = self._rngs[link] = random.Random(f"{self.plan.seed}/{link[0]}/{link[1]}")
        return rng

    def decide(self, direction: Direction, rank: int, envelope: Envelope) -> Verdict:
        """The fate of the next frame on link ``(direction, rank)``."""
        kind = envelope_kind(envelope)
        link = (direction, rank)
        index = self._frames.get(link, 0)
        self._frames[link] = index + 1
        self.bump(f"frames.{direction}.{kind}")
        t = self.now()
        if self.is_partitioned(rank, t):
            self.bump(f"partition.{direction}.{kind}")
            return Verdict((), partitioned=True)
        faults = self.plan.faults
        if not faults:
            return _PASS
        rng: random.Random | None = None
        dropped = False
        extra = 0
        delay = 0.0
        hold: float | None = None
        for i, fault in enumerate(faults):
            if not fault.matches(direction, rank, kind, t):
                continue
            key = (i, direction, rank)
            n = self._matched.get(key, 0) + 1
            self._matched[key] = n
            fire = bool(fault.every) and n % fault.every == 0
            if fault.probability:
                if rng is None:
                    rng = self._rng(link)
                fire = (rng.random() < fault.probability) or fire
            if not fire:
                continue
            detail = 0.0
            if fault.action == "drop":
                dropped = True
            elif fault.action == "duplicate":
                extra += fault.copies
                detail = float(fault.copies)
            elif fault.action == "delay":
                if rng is None:
                    rng = self._rng(link)
                detail = rng.uniform(fault.min_delay, fault.max_delay)
                delay += detail
            else:
                hold = fault.hold if hold is None else max(hold, fault.hold)
                detail = fault.hold
            self.bump(f"{fault.action}.{direction}.{kind}")
            self.log.append(Injection(t, direction, rank, index, kind, _envelope_id(envelope),
                                      fault.action, detail))
            if dropped:
                return Verdict(())
        if not extra and not delay and hold is None:
            return _PASS
        return Verdict((delay,) * (1 + extra), hold)
