"""First come, first served admission for any anyio program: :class:`AdmissionGate`.

::

    gate = AdmissionGate("flush")               # a synchronous __init__ may build it
    async with gate.admit(timeout=5.0):         # asyncio or trio
        await flush_every_rank()                # one holder at a time, in arrival order

    pipeline = AdmissionGate("update", holders=4)
    async with pipeline.admit() as ticket:      # up to 4 holders, admitted in arrival order
        await send(request)                     # holders start one at a time, in order
        pipeline.started(ticket)                # the next caller may be admitted now
        reply = await replies[request.id]       # up to 4 wait here at once
    # blocks are left in admission order

Guarantees (the same a :class:`~ctlwire.kernel.client.control_client.ControlClient`
gives: a queueing fan-out mailbox admits its callers through a gate):

* **Strict arrival order.** Callers are admitted in the order they arrived
  (:meth:`AdmissionGate.enter` records the arrival before its first await).
* **Up to ``holders`` at once, starting in order.** A caller holds a slot from
  its admission until it leaves or its work is decided (:meth:`~AdmissionGate.hand_off`);
  a caller is admitted only when a slot is free *and* the caller admitted before
  it has started (:meth:`~AdmissionGate.started`), been decided or left. So what
  each holder does before it calls ``started`` -- even if it awaits -- happens
  in admission order; a holder that never calls it admits nobody after it
  until it leaves (``holders=1``: one holder at a time, whatever it calls).
* **Leaving in order.** A block that ends normally waits until every caller
  admitted before it has left (:meth:`~AdmissionGate.wait_turn`); one that
  raises or is cancelled leaves at once.
* **Wake-up window closed.** Whatever frees a slot or a turn hands it to the
  next queued caller there and then, before that caller's task runs again: a
  caller arriving in between finds the gate held and queues behind (SGLang's
  ``FanOutCommunicator`` let it overtake).
* **A cancelled turn is only its own.** A queued caller that is cancelled or
  times out leaves the queue and the others keep their order; a caller handed
  the gate and cancelled before it ran again passes it on; a holder passes its
  slot and turn on however it leaves (return, exception, cancellation).
* **One deadline for the whole wait.** A caller still queued at its deadline
  raises :class:`~ctlwire.kernel.errors.RequestTimedOut` with
  ``admission=True`` (it was never admitted).
* **Closing.** :meth:`AdmissionGate.close` wakes every queued caller with
  :class:`~ctlwire.kernel.errors.ClientClosed` (later arrivals raise it) and
  every holder waiting for its turn to leave.

Nothing runs in the background and nothing is bound to an event loop at
construction: the gate uses the loop of the task that waits. Its order is
decided by the sans-IO :class:`~ctlwire.kernel.core.admission_queue.AdmissionQueue`,
the core the interleaving explorer (:mod:`ctlwire.testing.interleaving`)
drives through every interleaving of arrivals, starts, hand-offs, cancellations
and deadlines.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

import anyio
import anyio.lowlevel

from ctlwire.kernel.client.call_arguments import checked_timeout
from ctlwire.kernel.core.admission_queue import AdmissionQueue, Ticket, TicketObserver
from ctlwire.kernel.errors import ClientClosed, RequestTimedOut
from ctlwire.states import TicketState
from ctlwire.transports.task_waits import current_backend

__all__ = ["Admission", "AdmissionGate", "GateHost", "HandOffWaiter", "Reaper"]


class Reaper(Protocol):
    """Ends queued waits at their deadlines, one task for all
    (:class:`~ctlwire.kernel.client.deadline_reaper.DeadlineReaper`)."""

    @property
    def running(self) -> bool:
        """False: each caller bounds its own wait."""

    def arm(self, item: Ticket, deadline: float) -> None:
        """Set ``item``'s waiter at ``deadline`` if it is still queued."""


class GateHost(Protocol):
    """What a gate borrows from its owner (a client's
    :class:`~ctlwire.kernel.client.fan_out_mailbox.FanOutSender`); a gate of its own
    reads the running loop's."""

    @property
    def closed(self) -> bool:
        """True once the owner closed: queued callers get ClientClosed."""

    @property
    def now(self) -> Callable[[], float]:
        """The clock of the deadlines (anyio's cancel-scope clock)."""

    @property
    def new_waiter(self) -> Callable[[], Any]:
        """Makes the waiter one queued caller parks on (``set()``, ``wait()``)."""

    @property
    def reaper(self) -> Reaper | None:
        """Ends queued waits at their deadlines (None, or not running: each caller
        bounds its own wait)."""


class _RunningLoop:
    """The host of a gate of its own: the running loop's clock and waiters, looked up
    when a caller needs them (the gate may be built before any loop runs)."""

    closed = False
    reaper = None

    @property
    def now(self) -> Callable[[], float]:
        return anyio.current_time

    @property
    def new_waiter(self) -> Callable[[], Any]:
        return current_backend().new_waiter


_RUNNING_LOOP = _RunningLoop()
_ADMITTED = TicketState.ADMITTED


class AdmissionGate:
    """First come, first served admission, up to ``holders`` at a time (default 1),
    starting and leaving in admission order: whatever frees a slot hands it to the
    next queued caller before its task runs (the wake-up window is closed), a
    cancelled or timed-out turn is only its own, and one deadline bounds the
    whole wait.

    ``name`` labels its errors (a client's mailbox: the method). ``host``: the
    owner whose clock, waiters, deadline reaper and closing the gate shares
    (default: none, the running loop's). ``observer`` sees every ticket transition.
    ValueError for ``holders`` that is not an int >= 1.
    """

    def __init__(self, name: str = "", *, host: GateHost | None = None,
                 observer: TicketObserver | None = None, holders: int = 1) -> None:
        self.name = name
        self.host: GateHost = host if host is not None else _RUNNING_LOOP
        #: the sans-IO core deciding the order (its counters: ``admitted_total``, ...)
        self.queue = AdmissionQueue(name, observer, holders=holders)
        self._closed = False

    @property
    def holders(self) -> int:
        """How many callers may hold the gate at once."""
        return self.queue.holders

    @property
    def closed(self) -> bool:
        return self._closed or self.host.closed

    @property
    def depth(self) -> int:
        """Callers waiting (not counting the holders)."""
        return self.queue.depth

    @property
    def busy(self) -> bool:
        """A caller holds a slot of the gate."""
        return self.queue.busy

    def admit(self, timeout: float | None = None) -> Admission:
        """``async with gate.admit(timeout=...) as ticket``: hold the gate for the
        block; with ``holders > 1``, call :meth:`started` with ``ticket`` once the
        block's ordered first step is done. The block is left in admission order
        when it ends normally, at once when it raises.

        ``timeout`` (seconds, None for none) bounds the wait for admission.
        Raises RequestTimedOut (``admission=True``) or ClientClosed on entry;
        TypeError/ValueError for a bad ``timeout``, before arriving."""
        return Admission(self, math.inf if timeout is None else checked_timeout(timeout))

    async def enter(self, deadline: float = math.inf, budget: float | None = None, *,
                    check_cancelled: bool = True) -> Ticket:
        """Wait for this caller's turn by ``deadline`` (on the host's clock) and
        return its admitted ticket; the caller must :meth:`leave` it on every path
        out. Raises ClientClosed, or RequestTimedOut (``admission=True``; its
        ``timeout`` is ``budget``, default what was left) when still queued at
        ``deadline``. Arrival happens before the first await. A caller handed the
        gate and cancelled before it ran again raises its cancellation (and passes
        the gate on); ``check_cancelled=False``: the caller's own first step checks
        that (a client's send does)."""
        host = self.host
        if self._closed or host.closed:
            raise ClientClosed(f"{self.name or 'admission gate'} is closed")
        queue = self.queue
        ticket = queue.arrive()
        if ticket.state is _ADMITTED:
            queue.resumed(ticket)
            return ticket
        now = host.now
        try:
            if budget is None:
                budget = deadline - now()
            waiter = ticket.waiter = host.new_waiter()
            reaper = host.reaper
            if reaper is not None and reaper.running:
                reaper.arm(ticket, deadline)  # woken by hand-off or deadline
                await waiter.wait()
            else:
                with anyio.CancelScope(deadline=deadline):
                    await waiter.wait()
            if self._closed or host.closed:
                raise ClientClosed(f"{self.name or 'admission gate'} closed")  # nothing done
            if ticket.state is not _ADMITTED or now() >= deadline:
                # timed out in the queue (possibly at the very moment of hand-off:
                # then leaving passes the gate on)
                raise RequestTimedOut(self.name, budget, admission=True)
            if check_cancelled:  # handed the gate, then cancelled before running again
                await anyio.lowlevel.checkpoint_if_cancelled()
        except BaseException:
            self.leave(ticket)
            raise
        queue.resumed(ticket)
        return ticket

    def started(self, ticket: Ticket) -> None:
        """``ticket``'s holder did its ordered first step (a client: handed its
        frames over): the next caller may be admitted, if a slot is free. A no-op
        once it started, was decided or left."""
        admitted = self.queue.start(ticket)
        if admitted is not None:
            admitted.waiter.set()

    def leave(self, ticket: Ticket) -> None:
        """``ticket``'s caller is done, however it ended (a no-op the second time):
        the caller admitted next is woken, and so is the holder whose turn to
        leave came."""
        queue = self.queue
        admitted = queue.leave(ticket)
        if admitted is not None:
            admitted.waiter.set()
        out = queue.next_out()
        if out is not None and out.turn_waiter is not None:
            out.turn_waiter.set()

    async def wait_turn(self, ticket: Ticket, deadline: float = math.inf) -> bool:
        """Wait until every caller admitted before ``ticket``'s has left, so that
        holders leave in admission order. False when ``deadline`` (on the host's
        clock) passed first; True at once once the gate is closed."""
        queue = self.queue
        try:
            while not queue.turn(ticket) and not self.closed:
                if self.host.now() >= deadline:
                    return False
                waiter = ticket.turn_waiter = self.host.new_waiter()
                with anyio.CancelScope(deadline=deadline):
                    await waiter.wait()
        finally:
            ticket.turn_waiter = None
        return True

    def hand_off(self, ticket: Ticket, inner: Any) -> HandOffWaiter:
        """A waiter for the holder's own wait (``inner``: ``set()``, ``wait()``) that
        passes the holder's slot on first when set: the holder's work is decided
        (it counts as started), and the next caller is admitted before the holder
        runs again. The holder keeps its place in the order of leaving."""
        return HandOffWaiter(self.queue, ticket, inner)

    def close(self) -> None:
        """Wake every queued caller (it raises ClientClosed; later arrivals too) and
        every holder waiting for its turn to leave."""
        self._closed = True
        queue = self.queue
        for ticket in queue.queued():
            if ticket.waiter is not None:
                ticket.waiter.set()
        for ticket in queue.admitted():
            if ticket.turn_waiter is not None:
                ticket.turn_waiter.set()


class Admission:
    """``async with gate.admit()``: the holder's block (see :meth:`AdmissionGate.admit`);
    the admitted ticket is what ``as`` binds."""

    __slots__ = ("_gate", "_timeout", "ticket")

    def __init__(self, gate: AdmissionGate, timeout: float) -> None:
        self._gate = gate
        self._timeout = timeout
        self.ticket: Ticket | None = None

    async def __aenter__(self) -> Ticket:
        gate = self._gate
        timeout = self._timeout
        deadline = gate.host.now() + timeout if timeout != math.inf else math.inf
        self.ticket = await gate.enter(deadline, timeout)
        return self.ticket

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        ticket = self.ticket
        if ticket is None:
            return
        try:
            if exc_type is None:
                await self._gate.wait_turn(ticket)
        finally:
            self._gate.leave(ticket)


class HandOffWaiter:
    """A holder's waiter whose :meth:`set` first passes the holder's slot on (its
    work is decided) and wakes the caller admitted next, then the holder
    (``inner``). A client's queueing holder registers it for its request once its
    frames are handed over, so every decision of the request (the reply that
    completes it, a lost rank, its expiry, the client's close) passes the slot on.
    Setting it again is a no-op for the gate. ``wait`` is the inner waiter's."""

    __slots__ = ("inner", "queue", "ticket")

    def __init__(self, queue: AdmissionQueue, ticket: Ticket, inner: Any) -> None:
        self.queue = queue
        self.ticket = ticket
        self.inner = inner

    def set(self) -> None:
        admitted = self.queue.decide(self.ticket)
        if admitted is not None:
            admitted.waiter.set()
        self.inner.set()

    def wait(self) -> Any:
        """The inner waiter's ``wait()`` (an awaitable)."""
        return self.inner.wait()
