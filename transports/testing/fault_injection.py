"""Fault injection: wrap any transport to delay, drop, duplicate, reorder, partition or close.

For your own tests of code built on ctlwire (and for ctlwire's soak)::

    plan = FaultPlan(seed=7, faults=[
        Fault.drop(probability=0.01),                       # 1% of frames, both ways
        Fault.duplicate(probability=0.01, kinds={"reply"}),  # only Reply frames
        Fault.delay(0.001, 0.020, probability=0.05),         # uniform 1-20 ms
        Fault.reorder(probability=0.01),                     # swap with the next frame
        Fault.drop(every=10, direction="send", kinds={"request"}),
    ], partitions=[Partition(rank=2, start=1.0, end=2.0)])
    transport = FaultyClientTransport(MemoryNetwork().client_transport(), plan)
    async with ControlClient(transport, ranks=4) as client:
        transport.partition(1)          # by hand, as well as on the schedule
        ...
        transport.heal(1)
    print(transport.faults.counters)    # {"drop.send.request": 12, ...}

:class:`FaultyClientTransport` wraps a :class:`ClientTransport`,
:class:`FaultyEngineTransport` an :class:`EngineTransport`. Each frame is
matched by direction (``"send"`` or ``"receive"``, seen from the wrapped end),
envelope kind (``"request"``, ``"reply"``, ``"heartbeat"``), rank and time
window against the plan's :class:`Fault` rules, which fire every Nth matching
frame and/or with a probability.

Guarantees:

* **Deterministic given the seed.** Each link — one direction to or from one
  rank — has its own ``random.Random`` seeded from ``(seed, direction, rank)``:
  the fate of the n-th frame on a link depends only on the seed, n and the
  time (virtual time in tests makes that exact), not on how links interleave.
  Injections are recorded (:attr:`FaultInjector.log`) and counted
  (:attr:`FaultInjector.counters`): ``"<action>.<direction>.<kind>"`` for
  ``frames`` (seen), ``drop``, ``duplicate``, ``delay``, ``reorder``,
  ``partition`` (frames blocked) and ``lost`` (a delayed, held or duplicate
  copy that could not be delivered later); plus ``partitions_started``,
  ``partitions_healed``, ``partition_notices``, ``disconnects_suppressed`` and
  ``closed``.
* **A partition is a silent engine.** While ``rank`` is partitioned no frame
  passes either way, heartbeats included, and disconnection reports for it
  are suppressed; the client only learns through its liveness bound (unless
  ``notify=True``, which reports the link closed at once). Healing lets frames,
  hence heartbeats, flow again and the rank rejoins.
* **What passes keeps its order.** Frames without a fault keep their relative
  order; a delayed frame is overtaken by later ones; a reordered frame is held
  until the next frame on its link has passed (at most ``hold`` seconds).
* A frame sent now that the wrapped transport refuses raises as it would
  unwrapped (Unroutable, WouldBlock); copies delivered later (delayed, held,
  duplicated) that are refused are counted as ``lost`` instead.
* A disconnection of a rank (reported by the wrapped transport, or a send
  refused as Unroutable) loses that rank's frames still delayed or held, as a
  closed connection loses what it carried: no frame of a dead peer arrives
  after its death was reported.
* **Close.** The plan's ``close_at`` (or :meth:`FaultyClientTransport.close`)
  closes the client's side: sends and ``receive`` raise TransportClosed. On
  an engine it closes the wrapped transport, so the client sees it disconnect.
* Undecodable frames (``Dropped``) pass through untouched.

Delays run on anyio timers in a task group the wrapper owns, entered in
``__aenter__`` (so virtual clocks apply). A :class:`FaultyEngineTransport`
used synchronously (``open``/``try_receive``/``wait_readable``) releases
delayed frames whenever it is polled, on the monotonic clock.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, TypeVar

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ctlwire.transports.codec import Codec
from ctlwire.transports.envelope import Envelope, Heartbeat, Reply, Request
from ctlwire.transports.errors import TransportClosed, TransportError, Unroutable
from ctlwire.transports.transport import (
    ClientTransport,
    EngineTransport,
    PeerDisconnected,
    Received,
    Route,
    TransportEvent,
)

__all__ = [
    "Fault",
    "FaultInjector",
    "FaultPlan",
    "FaultyClientTransport",
    "FaultyEngineTransport",
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

    def _bump(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    # -- partitions -------------------------------------------------------------
    def partition(self, rank: int) -> None:
        """Cut ``rank`` off now, until :meth:`heal`."""
        if rank not in self._manual:
            self._manual.add(rank)
            self.events.append((self.now(), "partition", rank))
            self._bump("partitions_started")

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
            self._bump("partitions_healed")

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

    def begin_scheduled(self, index: int) -> None:
        """The schedule reached partition ``index``'s start (by its own timer)."""
        self._begun.add(index)

    def end_scheduled(self, index: int) -> None:
        """The schedule reached partition ``index``'s end."""
        self._ended.add(index)

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
        self._bump(f"frames.{direction}.{kind}")
        t = self.now()
        if self.is_partitioned(rank, t):
            self._bump(f"partition.{direction}.{kind}")
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
            self._bump(f"{fault.action}.{direction}.{kind}")
            self.log.append(Injection(t, direction, rank, index, kind, _envelope_id(envelope),
                                      fault.action, detail))
            if dropped:
                return Verdict(())
        if not extra and not delay and hold is None:
            return _PASS
        return Verdict((delay,) * (1 + extra), hold)


class _Held:
    __slots__ = ("deliver", "done")

    def __init__(self, deliver: Callable[[], None]) -> None:
        self.deliver = deliver
        self.done = False

    def release(self) -> None:
        if not self.done:
            self.done = True
            self.deliver()


class _DelayLine:
    """Timers on one heap: run by a task (:meth:`run`) or polled (:meth:`release_due`)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self._wake: anyio.Event | None = None

    def __len__(self) -> int:
        return len(self._heap)

    def schedule(self, due: float, fn: Callable[[], None]) -> None:
        self._seq += 1
        first = not self._heap or due < self._heap[0][0]
        heapq.heappush(self._heap, (due, self._seq, fn))
        if first and self._wake is not None:
            self._wake.set()

    def release_due(self, now: float) -> float | None:
        """Run every timer due by ``now``; returns the next due time, if any."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            heapq.heappop(heap)[2]()
        return heap[0][0] if heap else None

    async def run(self, clock: Callable[[], float]) -> None:
        while True:
            nxt = self.release_due(clock())
            self._wake = anyio.Event()
            with anyio.move_on_after(math.inf if nxt is None else max(0.0, nxt - clock())):
                await self._wake.wait()


class _FaultyBase:
    """Decision, delay line, held frames and the schedule task shared by the wrappers."""

    def __init__(self, plan: FaultPlan | FaultInjector | None) -> None:
        self.faults = plan if isinstance(plan, FaultInjector) else FaultInjector(plan)
        self._line = _DelayLine()
        self._held: dict[tuple[str, int], list[_Held]] = {}
        self._tg: TaskGroup | None = None
        self._closed = False
        self._clock: Callable[[], float] = anyio.current_time

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending_frames(self) -> int:
        """Frames waiting on a delay or a reorder hold."""
        return len(self._line)

    def _route(self, direction: Direction, rank: int, verdict: Verdict,
               deliver_now: Callable[[], None], deliver_later: Callable[[], None]) -> None:
        """Carry out ``verdict``: ``deliver_now`` for the first immediate copy (its
        errors propagate), ``deliver_later`` for every other copy."""
        if not verdict.delays:
            return
        now = self._clock()
        if verdict.hold is not None:
            held = self._held.setdefault((direction, rank), [])
            for _ in verdict.delays:
                h = _Held(deliver_later)
                held.append(h)
                self._line.schedule(now + verdict.hold, h.release)
            return
        immediate = False
        for d in verdict.delays:
            if d > 0:
                self._line.schedule(now + d, deliver_later)
            elif not immediate:
                immediate = True
                deliver_now()
            else:
                deliver_later()
        if immediate:
            self._release_held(direction, rank)

    def _release_held(self, direction: str, rank: int) -> None:
        """A frame passed on the link: frames held for reordering go right after it."""
        if self._held:
            released = self._held.pop((direction, rank), None)
            if released:
                for h in released:
                    h.release()

    def _lost(self, direction: str, envelope: Envelope) -> None:
        self.faults._bump(f"lost.{direction}.{envelope_kind(envelope)}")

    async def _run_schedule(self) -> None:
        faults = self.faults
        for at, what, index in faults.schedule():
            delay = at - faults.now()
            if delay > 0:
                await anyio.sleep(delay)
            if what == "close":
                faults.events.append((at, "close", -1))
                self._on_close_fault()
                continue
            part = faults.plan.partitions[index]
            if index in faults._healed:
                continue
            faults.events.append((at, what, part.rank))
            if what == "partition":
                faults.begin_scheduled(index)
                faults._bump("partitions_started")
                if part.notify:
                    self._notify_partition(part.rank)
            else:
                faults.end_scheduled(index)
                faults._bump("partitions_healed")

    def _on_close_fault(self) -> None:
        raise NotImplementedError

    def _notify_partition(self, rank: int) -> None:
        pass

    async def _start_tasks(self) -> None:
        self.faults.start(anyio.current_time)
        self._clock = self.faults.clock or anyio.current_time
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        tg.start_soon(self._line.run, self._clock, name="ctlwire.faults.delays")
        if self.faults.schedule():
            tg.start_soon(self._run_schedule, name="ctlwire.faults.schedule")

    async def _stop_tasks(self) -> None:
        tg, self._tg = self._tg, None
        if tg is not None:
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)


class FaultyClientTransport(_FaultyBase):
    """A :class:`ClientTransport` that injects the faults of ``plan`` (a
    :class:`FaultPlan`, or a :class:`FaultInjector` to share) into ``inner``.

    ``send`` direction: client to engines; ``receive``: engines to client.
    Received events are pumped by a task of the wrapper into an unbounded
    buffer. :meth:`partition`, :meth:`heal` and :meth:`close` inject by hand.
    """

    def __init__(self, inner: ClientTransport, plan: FaultPlan | FaultInjector | None = None
                 ) -> None:
        super().__init__(plan)
        self.inner = inner
        self.codec: Codec = inner.codec
        send, recv = anyio.create_memory_object_stream[TransportEvent](math.inf)
        self._epochs: dict[int, int] = {}
        self._out: MemoryObjectSendStream[TransportEvent] = send
        self._in: MemoryObjectReceiveStream[TransportEvent] = recv

    async def __aenter__(self) -> FaultyClientTransport:
        await self.inner.__aenter__()
        try:
            await self._start_tasks()
            assert self._tg is not None
            self._tg.start_soon(self._pump, name="ctlwire.faults.pump")
        except BaseException:
            await self.inner.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self._closed = True
        self._out.close()
        try:
            await self._stop_tasks()
        finally:
            await self.inner.__aexit__(exc_type, exc, tb)
            self._in.close()

    # -- faults by hand -----------------------------------------------------------
    def partition(self, rank: int, *, notify: bool = False) -> None:
        """Cut ``rank`` off now (silently, unless ``notify``) until :meth:`heal`."""
        self.faults.partition(rank)
        if notify:
            self._notify_partition(rank)

    def heal(self, rank: int) -> None:
        """End ``rank``'s partition: its frames (and heartbeats) flow again."""
        self.faults.heal(rank)

    def close(self) -> None:
        """Close the transport as the client sees it: sends and :meth:`receive`
        raise TransportClosed from now on (the wrapped transport is closed on exit)."""
        if not self._closed:
            self._closed = True
            self.faults._bump("closed")
            self._out.close()

    def _on_close_fault(self) -> None:
        self.close()

    def _notify_partition(self, rank: int) -> None:
        self.faults._bump("partition_notices")
        self._put(PeerDisconnected(rank, "partitioned (fault injection)"))

    # -- ClientTransport -------------------------------------------------------------
    def _check(self) -> None:
        if self._closed:
            raise TransportClosed("transport is closed (fault injection)")

    def send_nowait(self, rank: int, envelope: Envelope) -> None:
        self._check()
        verdict = self.faults.decide("send", rank, envelope)
        try:
            if verdict is _PASS:
                self.inner.send_nowait(rank, envelope)
                self._release_held("send", rank)
                return
            self._route("send", rank, verdict, lambda: self.inner.send_nowait(rank, envelope),
                        self._send_later(rank, envelope))
        except Unroutable:
            self._disconnected(rank)
            raise

    async def send(self, rank: int, envelope: Envelope) -> None:
        self._check()
        verdict = self.faults.decide("send", rank, envelope)
        try:
            if verdict is _PASS:
                await self.inner.send(rank, envelope)
                self._release_held("send", rank)
                return
            later = self._send_later(rank, envelope)
            if verdict.delays and verdict.hold is None and verdict.delays[0] <= 0:
                await self.inner.send(rank, envelope)  # the first copy waits for room
                for _ in verdict.delays[1:]:
                    later()
                self._release_held("send", rank)
                return
            self._route("send", rank, verdict, later, later)
        except Unroutable:
            self._disconnected(rank)
            raise

    def _disconnected(self, rank: int) -> None:
        """The connection to ``rank`` ended: what it still carried (delayed or
        held frames) is lost with it."""
        self._epochs[rank] = self._epochs.get(rank, 0) + 1

    def _send_later(self, rank: int, envelope: Envelope) -> Callable[[], None]:
        epoch = self._epochs.get(rank, 0)

        def deliver() -> None:
            if (self._closed or self.faults.is_partitioned(rank)
                    or self._epochs.get(rank, 0) != epoch):
                self._lost("send", envelope)
                return
            try:
                self.inner.send_nowait(rank, envelope)
            except Unroutable:
                self._disconnected(rank)
                self._lost("send", envelope)
            except TransportError:
                self._lost("send", envelope)

        return deliver

    async def receive(self) -> TransportEvent:
        self._check()
        try:
            return await self._in.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise TransportClosed("transport is closed") from None

    # -- the receive side ---------------------------------------------------------------
    def _put(self, event: TransportEvent) -> None:
        try:
            self._out.send_nowait(event)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            if type(event) is Received:
                self._lost("receive", event.envelope)

    def _received_later(self, event: Received, rank: int) -> Callable[[], None]:
        epoch = self._epochs.get(rank, 0)

        def deliver() -> None:
            if self.faults.is_partitioned(rank) or self._epochs.get(rank, 0) != epoch:
                self._lost("receive", event.envelope)
            else:
                self._put(event)

        return deliver

    async def _pump(self) -> None:
        faults = self.faults
        while True:
            try:
                event = await self.inner.receive()
            except TransportClosed:
                self._out.close()
                return
            if type(event) is Received:
                env = event.envelope
                if isinstance(env, Request):
                    self._put(event)  # not something an engine sends: the kernel counts it
                    continue
                rank = event.peer if event.peer is not None else env.rank
                verdict = faults.decide("receive", rank, env)
                if verdict is _PASS:
                    self._put(event)
                    self._release_held("receive", rank)
                else:
                    later = self._received_later(event, rank)
                    self._route("receive", rank, verdict, later, later)
            elif type(event) is PeerDisconnected:
                if event.rank is not None and faults.is_partitioned(event.rank):
                    faults._bump("disconnects_suppressed")
                else:
                    if event.rank is not None:
                        self._disconnected(event.rank)
                    self._put(event)
            else:
                self._put(event)


class FaultyEngineTransport(_FaultyBase):
    """An :class:`EngineTransport` for one rank that injects the faults of
    ``plan`` into ``inner``.

    ``send`` direction: engine to client; ``receive``: client to engine.
    :meth:`partition` / :meth:`heal` cut this rank off and back; the plan's
    ``close_at`` closes the wrapped transport (the client sees the engine
    disconnect). Works from an event loop (``async with``, :meth:`receive`)
    and from a synchronous poll loop, which releases delayed frames when it
    polls.
    """

    def __init__(self, inner: EngineTransport, plan: FaultPlan | FaultInjector | None = None
                 ) -> None:
        super().__init__(plan)
        self.inner = inner
        self.codec: Codec = inner.codec
        self.rank: int = inner.rank
        self._ready: deque[TransportEvent] = deque()
        self._async = False
        self._wake: anyio.Event | None = None
        self._ended = False

    # -- lifetime -----------------------------------------------------------------------
    def open(self) -> None:
        """Open the wrapped transport (synchronous use: the plan's clock is monotonic)."""
        if not self.faults.started:
            self.faults.start(time.monotonic)
        clock = self.faults.clock
        assert clock is not None
        self._clock = clock
        self.inner.open()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.inner.close()
            self._signal()

    async def __aenter__(self) -> FaultyEngineTransport:
        await self.inner.__aenter__()
        self._async = True
        try:
            await self._start_tasks()
            assert self._tg is not None
            self._tg.start_soon(self._pump, name="ctlwire.faults.pump")
        except BaseException:
            await self.inner.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self._closed = True
        try:
            await self._stop_tasks()
        finally:
            await self.inner.__aexit__(exc_type, exc, tb)

    # -- faults by hand -----------------------------------------------------------------
    def partition(self) -> None:
        """Cut this rank off now until :meth:`heal`."""
        self.faults.partition(self.rank)

    def heal(self) -> None:
        self.faults.heal(self.rank)

    def _on_close_fault(self) -> None:
        self.faults._bump("closed")
        self.close()

    def _poll_schedule(self) -> None:
        """Synchronous use: apply what the schedule task would have applied."""
        if self._async:
            return
        close_at = self.faults.plan.close_at
        if close_at is not None and not self._closed and self.faults.now() >= close_at:
            self.faults.events.append((close_at, "close", -1))
            self._on_close_fault()
        self._line.release_due(self._clock())

    # -- receive --------------------------------------------------------------------------
    def _signal(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _deliver(self, event: TransportEvent) -> None:
        self._ready.append(event)
        self._signal()

    def _accept(self, event: TransportEvent) -> None:
        """Apply the receive-side faults to one event from the wrapped transport."""
        if type(event) is Received:
            env = event.envelope
            if type(env) is Reply:
                self._deliver(event)  # not something a client sends: the endpoint counts it
                return
            verdict = self.faults.decide("receive", self.rank, env)
            if verdict is _PASS:
                self._deliver(event)
                self._release_held("receive", self.rank)
                return

            def later() -> None:
                if self.faults.is_partitioned(self.rank):
                    self._lost("receive", env)
                else:
                    self._deliver(event)

            self._route("receive", self.rank, verdict, later, later)
        elif type(event) is PeerDisconnected and self.faults.is_partitioned(self.rank):
            self.faults._bump("disconnects_suppressed")
        else:
            self._deliver(event)

    async def _pump(self) -> None:
        while True:
            try:
                event = await self.inner.receive()
            except TransportClosed:
                self._ended = True
                self._signal()
                return
            self._accept(event)

    def try_receive(self) -> TransportEvent | None:
        if self._closed:
            raise TransportClosed("transport is closed")
        self._poll_schedule()
        while not self._ready:
            if self._async:
                if self._ended:
                    raise TransportClosed("transport is closed")
                return None
            event = self.inner.try_receive()
            if event is None:
                return None
            self._accept(event)
        return self._ready.popleft()

    def wait_readable(self, timeout: float) -> bool:
        self._poll_schedule()
        if self._ready:
            return True
        nxt = self._line.release_due(self._clock())
        if self._ready:
            return True
        if nxt is not None:
            timeout = min(timeout, max(0.0, nxt - self._clock()))
        return self.inner.wait_readable(timeout) or bool(self._ready)

    async def receive(self) -> TransportEvent:
        while True:
            if self._ready:
                return self._ready.popleft()
            if self._closed or self._ended:
                raise TransportClosed("transport is closed")
            self._wake = anyio.Event()
            await self._wake.wait()

    # -- send -------------------------------------------------------------------------------
    def _send_later(self, route: Route, envelope: Envelope) -> None:
        if self._closed or self.faults.is_partitioned(self.rank):
            self._lost("send", envelope)
            return
        try:
            self.inner.send_nowait(route, envelope)
        except TransportError:
            self._lost("send", envelope)

    def send_nowait(self, route: Route, envelope: Envelope) -> None:
        if self._closed:
            raise TransportClosed("transport is closed")
        self._poll_schedule()
        verdict = self.faults.decide("send", self.rank, envelope)
        if verdict is _PASS:
            self.inner.send_nowait(route, envelope)
            self._release_held("send", self.rank)
            return
        self._route("send", self.rank, verdict,
                    lambda: self.inner.send_nowait(route, envelope),
                    lambda: self._send_later(route, envelope))

    async def send(self, route: Route, envelope: Envelope) -> None:
        if self._closed:
            raise TransportClosed("transport is closed")
        verdict = self.faults.decide("send", self.rank, envelope)
        if verdict is _PASS:
            await self.inner.send(route, envelope)
            self._release_held("send", self.rank)
            return
        if verdict.delays and verdict.hold is None and verdict.delays[0] <= 0:
            await self.inner.send(route, envelope)
            for _ in verdict.delays[1:]:
                self._send_later(route, envelope)
            self._release_held("send", self.rank)
            return
        self._route("send", self.rank, verdict, lambda: self._send_later(route, envelope),
                    lambda: self._send_later(route, envelope))

    def heartbeat_routes(self) -> Iterable[Route]:
        return self.inner.heartbeat_routes()
