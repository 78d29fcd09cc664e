"""One method's fan-out mailbox: a FIFO admission gate, or shared watching (anyio shell).

Queueing mode: a fan-out's issuer consults the method's mailbox
(:meth:`FanOutMailbox.admit` before it registers, :meth:`FanOutMailbox.leave`
in its ``finally``); concurrent callers are admitted strictly in arrival order,
one undecided request in flight at a time, through the
:class:`~ctlwire.kernel.core.admission_queue.AdmissionQueue` core. Admission is
a hand-off: done by the holder's request the moment it is decided (its
:class:`HandOffWaiter` wakes the next caller before the holder), or by the
holder leaving undecided. A caller arriving in the wake-up window queues
behind, a queued caller's cancellation or timeout removes only its own ticket,
and an exception or cancellation in the holder still passes the mailbox on.
The whole call, queueing included, is bounded by its deadline; a caller still
queued at its deadline gets RequestTimedOut with ``admission=True`` ("timed
out waiting for admission", nothing sent), and a caller still queued when the
client closes gets ClientClosed at once. A caller cancelled after being handed
the mailbox but before it resumed sends nothing and passes the mailbox on.

Watching mode (:meth:`FanOutMailbox.watching`): a caller whose request
(same payload, ranks and policy) is already in flight joins it instead of
sending another; every caller receives its own freshly decoded copy of the
result. The shared request lives until its last watcher leaves, so the
first caller's cancellation does not take the answer away from the others.

The mailbox talks to the client only through :class:`FanOutSender`, the
narrow interface of what it needs (the clock, the deadline reaper, and for
watching the steps of one fan-out); the client's
:class:`~ctlwire.kernel.client.call_issuer.CallIssuer` provides it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

import anyio
import msgspec

from ctlwire.kernel.client.call_outcome import CallOutcomes
from ctlwire.kernel.client.deadline_reaper import DeadlineReaper
from ctlwire.kernel.core.admission_queue import AdmissionQueue, Ticket
from ctlwire.kernel.core.fan_out_policy import Policy
from ctlwire.kernel.core.fan_out_result import FanOutResult
from ctlwire.kernel.core.request_registry import PendingRequest, RequestRegistry
from ctlwire.kernel.errors import ClientClosed, RequestTimedOut
from ctlwire.states import TicketState

__all__ = ["FanOutMailbox", "FanOutMailboxes", "FanOutMode", "FanOutSender", "HandOffWaiter"]

_WatchKey = tuple[bytes, tuple[int, ...], Policy]
FanOutMode = Literal["queueing", "watching", "concurrent"]


class FanOutSender(Protocol):
    """What a mailbox needs from its client to run one fan-out (implemented by
    :class:`~ctlwire.kernel.client.call_issuer.CallIssuer`)."""

    @property
    def closed(self) -> bool:
        """True once the client closed: queued callers get ClientClosed."""

    @property
    def now(self) -> Callable[[], float]:
        """The client's clock (the event loop's, as anyio's cancel-scope deadlines)."""

    @property
    def new_waiter(self) -> Callable[[], Any]:
        """Makes the waiter one caller parks on (set ``wait()``, once)."""

    @property
    def registry(self) -> RequestRegistry:
        """The request map (watchers retain the shared entry)."""

    @property
    def reaper(self) -> DeadlineReaper:
        """Ends a queued ticket's wait at its deadline (while it runs)."""

    @property
    def outcomes(self) -> CallOutcomes:
        """Each holder's freshly decoded result, or its typed failure."""

    def register(self, method: str, ranks: tuple[int, ...], policy: Policy, budget: float,
                 deadline: float | None = None, waiter: Any = None) -> PendingRequest:
        """One caller's entry in the request map (woken through ``waiter``)."""

    async def send_all(self, entry: PendingRequest, raw: msgspec.Raw, key: str = "",
                       fence: int | None = None) -> None:
        """Hand the frames to the transport for each rank the request map releases."""

    async def wait_outcome(self, entry: PendingRequest, deadline: float) -> None:
        """Wait until the request is decided or ``deadline`` passes."""


class FanOutMailbox:
    """Admission of fan-outs of one method; created by ``ControlClient.mailbox``."""

    def __init__(self, sender: FanOutSender, method: str) -> None:
        self.sender = sender
        self.method = method
        self.queue = AdmissionQueue(method)
        self._watched: dict[_WatchKey, PendingRequest] = {}
        self.watch_joins = 0

    @property
    def depth(self) -> int:
        """Callers waiting for admission."""
        return self.queue.depth

    @property
    def watched(self) -> int:
        """Shared requests in flight in watching mode."""
        return len(self._watched)

    async def admit(self, deadline: float, budget: float) -> Ticket:
        """Wait for this caller's turn (first come, first served), by ``deadline``;
        the admitted ticket's request registers :meth:`hand_off` as its waiter
        and the caller calls :meth:`leave` on every path out. Raises ClientClosed,
        or RequestTimedOut (``admission=True``) when still queued at ``deadline``."""
        sender = self.sender
        if sender.closed:
            raise ClientClosed("client is closed")
        ticket = self.queue.arrive()
        if ticket.state is TicketState.ADMITTED:
            self.queue.resumed(ticket)
            return ticket
        try:
            waiter = ticket.waiter = sender.new_waiter()
            reaper = sender.reaper
            if reaper.running:
                reaper.arm(ticket, deadline)  # woken by hand-off or deadline
                await waiter.wait()
            else:
                with anyio.move_on_after(deadline - sender.now()):
                    await waiter.wait()
            if sender.closed:
                raise ClientClosed("client closed")  # woken by aclose(): nothing sent
            if self.queue.holder is not ticket or sender.now() >= deadline:
                # timed out in the queue (possibly at the very moment of hand-off:
                # then nothing is sent, and leaving passes the mailbox on)
                raise RequestTimedOut(self.method, budget, admission=True)
        except BaseException:
            self.leave(ticket)
            raise
        self.queue.resumed(ticket)
        return ticket

    def hand_off(self, ticket: Ticket) -> HandOffWaiter:
        """The waiter of admitted ``ticket``'s request: its decision passes the
        mailbox on (the next caller is woken first)."""
        return HandOffWaiter(self.queue, ticket, self.sender.new_waiter())

    def leave(self, ticket: Ticket) -> None:
        """``ticket``'s caller is done, however it ended (a no-op the second time):
        the caller admitted next is woken."""
        admitted = self.queue.leave(ticket)
        if admitted is not None:
            admitted.waiter.set()

    async def watching(self, raw: msgspec.Raw, ranks: tuple[int, ...], policy: Policy,
                       budget: float, deadline: float, result_type: Any, key: str = "",
                       fence: int | None = None, left_out: dict[int, str] | None = None
                       ) -> FanOutResult:
        """Join an identical in-flight request, or start one, and wait for it by
        ``deadline``; own copy of the result. ``key``, ``fence`` and ``left_out``
        (the present ranks it does not address) go with a request this caller
        starts."""
        sender = self.sender
        registry = sender.registry
        shared: _WatchKey = (bytes(raw), ranks, policy)
        entry = self._watched.get(shared)
        if entry is not None and entry.is_open:
            # join: a holder of the shared entry, which only waits and releases
            if sender.closed:
                raise ClientClosed("client is closed")
            registry.retain(entry)
            self.watch_joins += 1
            leader = False
        else:
            # several callers wait for it: an event, not a one-task waiter
            entry = sender.register(self.method, ranks, policy, budget, deadline,
                                    anyio.Event())
            entry.left_out = left_out
            self._watched[shared] = entry
            leader = True
        try:
            if leader:
                await sender.send_all(entry, raw, key, fence)
            await sender.wait_outcome(entry, deadline)
            if entry.is_open:  # our own deadline passed before the shared one
                raise RequestTimedOut(self.method, budget, entry.id,
                                      partial=sender.outcomes.fan_out_result(entry, result_type))
            return sender.outcomes.fan_out_outcome(entry, result_type)
        finally:
            registry.release(entry)
            if self._watched.get(shared) is entry and not entry.is_open:
                del self._watched[shared]


class FanOutMailboxes:
    """The mailboxes of one client, one per method (created on first use)."""

    def __init__(self, sender: FanOutSender) -> None:
        self.sender = sender
        self.by_method: dict[str, FanOutMailbox] = {}

    def get(self, method: str) -> FanOutMailbox:
        box = self.by_method.get(method)
        if box is None:
            box = self.by_method[method] = FanOutMailbox(self.sender, method)
        return box

    def for_mode(self, mode: FanOutMode, method: str) -> FanOutMailbox | None:
        """The mailbox a fan-out of ``method`` in ``mode`` consults (None for
        ``concurrent``: no admission); ValueError for an unknown mode."""
        if mode == "queueing" or mode == "watching":
            return self.get(method)
        if mode == "concurrent":
            return None
        raise ValueError(f"unknown mode {mode!r}: expected queueing, watching or concurrent")

    def close(self) -> None:
        """Wake every caller still queued for admission: it finds the client closed."""
        for box in self.by_method.values():
            for ticket in box.queue.queued():
                if ticket.waiter is not None:
                    ticket.waiter.set()


class HandOffWaiter:
    """The waiter a queueing holder registers for its request: :meth:`set` runs when
    the request is decided (every wake-up of a request's waiter is: the reply that
    completes it, the failed send or lost rank that decides it, its expiry, the
    client's close). It leaves the mailbox, wakes the caller admitted next, then
    the holder (``inner``). Leaving again (``set`` twice, or the holder's
    ``finally``) is a no-op. ``wait`` is the inner waiter's."""

    __slots__ = ("inner", "queue", "ticket")

    def __init__(self, queue: AdmissionQueue, ticket: Ticket, inner: Any) -> None:
        self.queue = queue
        self.ticket = ticket
        self.inner = inner

    def set(self) -> None:
        admitted = self.queue.leave(self.ticket)
        if admitted is not None:
            admitted.waiter.set()
        self.inner.set()

    def wait(self) -> Any:
        """The inner waiter's ``wait()`` (an awaitable)."""
        return self.inner.wait()
