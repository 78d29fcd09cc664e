"""What both faulty wrappers share: the delay line of frames delivered later, held
(reordered) frames, the partition schedule, opening the wrapped transport.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup

from ctlwire.testing.faults._faults import Direction, FaultPlan, Verdict, envelope_kind
from ctlwire.testing.faults._injector import FaultInjector
from ctlwire.transports.envelope import Envelope


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
        self.faults.bump(f"lost.{direction}.{envelope_kind(envelope)}")

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
            if what == "partition":
                if faults.begin_scheduled(index, at) and part.notify:
                    self._notify_partition(part.rank)
            else:
                faults.end_scheduled(index, at)

    def _on_close_fault(self) -> None:
        raise NotImplementedError

    def _notify_partition(self, rank: int) -> None:
        pass

    async def _enter(self, inner: Any) -> None:
        """Open the wrapped transport ``inner``, then start the fault tasks and the
        pump (:meth:`_pump`); if that fails, ``inner`` is closed again."""
        await inner.__aenter__()
        try:
            await self._start_tasks()
            assert self._tg is not None
            self._tg.start_soon(self._pump, name="ctlwire.faults.pump")
        except BaseException:
            await inner.__aexit__(None, None, None)
            raise

    async def _pump(self) -> None:
        raise NotImplementedError

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
