"""One task that ends every wait at its deadline: the client's deadline reaper (anyio shell).

A :class:`~ctlwire.kernel.client.control_client.ControlClient` waits for thousands of
requests and admission tickets at once. Instead of a cancel scope (a timer)
per call, each wait is *armed* here with its deadline, and one task sleeps
until the earliest one::

    reaper = DeadlineReaper(registry, wake=PendingRequest.wake)
    tg.start_soon(reaper.run, clock)          # in the client's task group
    ...
    if reaper.running:
        reaper.arm(entry, entry.deadline)     # then just await the entry's waiter
        await entry.waiter.wait()

Guarantees:

* **Every armed wait ends by its deadline.** At a deadline that has passed (on
  the ``clock`` given to :meth:`run`), an armed request still open is expired
  in the registry (TimedOut) and ``wake(entry)`` is called (its waiters and a
  send blocked on its behalf are woken); an armed ticket still queued has its
  waiter set (the caller finds itself not admitted: timed out). Arming an
  earlier deadline than the one the task sleeps until wakes the task earlier.
* **Finished items cost nothing.** A request decided, or a ticket admitted or
  abandoned, before its deadline is skipped when its turn comes (lazy
  deletion): finished items at the top of the heap are dropped at the next
  arm (calls of one budget finish in about the order they were armed, so
  they do not pile up behind a live one and keep their entries alive), and
  the reaper never sleeps until the deadline of a finished item it can see
  at the top of the heap. The heap is rebuilt (finished items
  dropped) once it holds more than twice what the last rebuild kept plus
  1,024 items, so it stays bounded by the waits in progress and the rebuilds
  cost O(1) per arm however many waits are live (queued tickets count as live:
  a burst of thousands of queued callers does not rebuild on every arm).
* **No reaper, no promise.** :attr:`running` is False before :meth:`run`
  starts and after it ends (the client is closing, or the task failed); a
  caller must then bound its wait with a cancel scope of its own. Items armed
  while it is not running are only reaped if it runs again.

Nothing here sends or receives: the reaper reads a clock, the registry and the
ticket states, and calls ``wake``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable

import anyio

from ctlwire.kernel.core.admission_queue import Ticket
from ctlwire.kernel.core.request_registry import PendingRequest, RequestRegistry
from ctlwire.states import TicketState

__all__ = ["DeadlineReaper"]

_QUEUED = TicketState.QUEUED


def _still_waiting(item: PendingRequest | Ticket) -> bool:
    if type(item) is PendingRequest:
        return item.is_open
    return item.state is TicketState.QUEUED


class DeadlineReaper:
    """Ends armed waits at their deadlines; see the module docstring."""

    __slots__ = ("_deadline_seq", "_deadlines", "_rebuild_at", "_registry", "_sleep_until",
                 "_wake", "rebuilds", "scope")

    #: slack of the rebuild threshold: a heap of up to this many items is never rebuilt
    REBUILD_SLACK = 1024

    def __init__(self, registry: RequestRegistry,
                 wake: Callable[[PendingRequest], None]) -> None:
        self._registry = registry
        self._wake = wake
        # (deadline, sequence, entry); finished entries are skipped lazily
        self._deadlines: list[tuple[float, int, PendingRequest | Ticket]] = []
        self._deadline_seq = itertools.count()
        # rebuild once the heap holds more items than this (2 x kept + slack)
        self._rebuild_at = self.REBUILD_SLACK
        #: heap rebuilds so far (dropping finished items)
        self.rebuilds = 0
        self._sleep_until = math.inf  # the deadline of ``scope`` (no property call per arm)
        #: the scope the reaper task sleeps in (its deadline: the earliest armed
        #: deadline); None while the task is not running
        self.scope: anyio.CancelScope | None = None

    @property
    def running(self) -> bool:
        """True while the reaper task runs: armed waits end at their deadlines."""
        return self.scope is not None

    @property
    def armed(self) -> int:
        """Items in the heap (finished ones not yet skipped included)."""
        return len(self._deadlines)

    def arm(self, item: PendingRequest | Ticket, deadline: float) -> None:
        """End ``item``'s wait at ``deadline``: a request is expired (and woken),
        a ticket still queued has its waiter woken."""
        heap = self._deadlines
        # items finished at the top go now, not at their deadlines: calls of one budget
        # finish in the order they were armed, so the heap holds the live ones only
        while heap:
            top = heap[0][2]
            if top.is_open if type(top) is PendingRequest else top.state is _QUEUED:
                break
            heapq.heappop(heap)
        heapq.heappush(heap, (deadline, next(self._deadline_seq), item))
        if deadline < self._sleep_until and self.scope is not None:
            self.scope.deadline = self._sleep_until = deadline  # the reaper wakes earlier
        if len(heap) > self._rebuild_at:
            # lazy deletion left too many finished items behind: rebuild. The next
            # rebuild waits for at least as many arms as this one kept (+ slack),
            # so rebuilding costs O(1) per arm even when most items are live.
            kept = [i for i in heap if _still_waiting(i[2])]
            heapq.heapify(kept)
            self._deadlines = kept
            self._rebuild_at = 2 * len(kept) + self.REBUILD_SLACK
            self.rebuilds += 1

    async def run(self, now: Callable[[], float]) -> None:
        """The reaper task: end waits at their deadlines on the clock ``now``
        (the event loop's, which anyio's cancel-scope deadlines use)."""
        registry = self._registry
        wake = self._wake
        while True:
            heap = self._deadlines
            current = now()
            while heap and heap[0][0] <= current:
                item = heapq.heappop(heap)[2]
                if type(item) is PendingRequest:
                    if item.is_open and registry.expire(item):
                        wake(item)
                elif item.state is TicketState.QUEUED and item.waiter is not None:
                    item.waiter.set()  # the caller finds itself not admitted: timed out
            while heap and not _still_waiting(heap[0][2]):
                heapq.heappop(heap)  # finished early: no wake-up at its deadline
            self._sleep_until = heap[0][0] if heap else math.inf
            scope = self.scope = anyio.CancelScope(deadline=self._sleep_until)
            try:
                with scope:
                    await anyio.sleep_forever()
            except BaseException:
                self.scope = None  # waits fall back to their own scopes
                raise
