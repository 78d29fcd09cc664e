"""The sans-IO protocol of one caller: admission, registration, sends, wait, cleanup.

:class:`CallCore` is the synchronous sequence every ``call`` and queueing
``fan_out`` follows; the anyio shells (:class:`ControlClient`,
:class:`FanOutMailbox`) only add the awaits between its steps, and the
interleaving explorer (:mod:`ctlwire.kernel.testing.interleaving`) drives the same
object step by step::

    core = CallCore(registry, "pause", ranks=(0, 1), queue=mailbox_queue)
    if not core.arrive():        # queued: wait until core.ticket is admitted
        ...                      # (await the ticket's waiter)
    core.resume()
    core.register(waiter)        # the request-map entry exists from here on
    while (rank := core.next_send()) is not None:
        ...                      # hand the frame for `rank` to the transport
        # on failure: core.send_failed(rank, error)
    # (or: for rank in core.release_all(): ... the same, every rank released at once,
    #  when the frames are handed over without suspending in between)
    if core.begin_wait():
        ...                      # await the waiter until the deadline
        core.deadline_passed()   # if the wait timed out
    ...                          # read core.entry's outcome
    core.finish()                # in `finally`: clean up, pass the mailbox on

A queueing caller registers a :class:`HandOffWaiter` instead of its bare waiter:
the request's decision (Done, Failed, TimedOut) passes the mailbox on at once,
waking the next caller before the holder itself, so the next request is sent
while the holder still reads its outcome and cleans up; :meth:`finish` then only
cleans up.

Ordering guarantee: :meth:`next_send` returns a rank only after the entry is
registered and marked Sent, so no reply can ever find its request missing or
still Registered. :meth:`finish` is safe at any point (before admission,
between sends, after the outcome) and leaves no entry and no ticket behind.

Admission guarantee: at most one *undecided* request per mailbox at any time,
the holder's; a decided holder's entry may coexist with the next holder's until
the decided holder finishes (it only reads its outcome and is cleaned).

Cancellation: a shell must not hand any frame over for a caller that is
already cancelled. ``CallIssuer.send_all`` checks for cancellation before
its first :meth:`next_send` (a caller cancelled while queued, or handed the
mailbox and cancelled before it resumed, sends nothing; its :meth:`finish`
passes the mailbox on).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ctlwire.kernel.core.admission_queue import AdmissionQueue, Ticket
from ctlwire.kernel.core.fan_out_policy import Policy
from ctlwire.kernel.core.request_registry import PendingRequest, RequestRegistry, Waiter
from ctlwire.states import TicketState

__all__ = ["CallCore", "HandOffWaiter"]


class CallCore:
    """One caller's protocol; see the module docstring."""

    __slots__ = ("_next", "deadline", "entry", "fence", "is_lost", "key", "method", "policy",
                 "queue", "ranks", "registry", "ticket", "timeout")

    def __init__(self, registry: RequestRegistry, method: str, ranks: tuple[int, ...],
                 policy: Policy = Policy.ALL, *, deadline: float | None = None,
                 timeout: float = 0.0, queue: AdmissionQueue | None = None,
                 is_lost: Callable[[int], bool] | None = None, key: str = "",
                 fence: int | None = None) -> None:
        self.registry = registry
        self.method = method
        self.ranks = ranks
        self.policy = policy
        self.deadline = deadline
        self.timeout = timeout
        self.queue = queue
        self.is_lost = is_lost
        #: the envelope's idempotency key and fencing token (None: the client's)
        self.key = key
        self.fence = fence
        self.ticket: Ticket | None = None
        self.entry: PendingRequest | None = None
        self._next = 0

    # -- admission -------------------------------------------------------------
    def arrive(self, waiter: Any = None) -> bool:
        """Join the mailbox queue (if any). True when admitted at once."""
        if self.queue is None:
            return True
        self.ticket = self.queue.arrive(waiter)
        return self.ticket.state is TicketState.ADMITTED

    @property
    def admitted(self) -> bool:
        return self.ticket is None or self.ticket.state is TicketState.ADMITTED

    def resume(self) -> None:
        """The caller's task runs again after being admitted."""
        if self.queue is not None and self.ticket is not None:
            self.queue.resumed(self.ticket)

    # -- the request -------------------------------------------------------------
    def register(self, waiter: Waiter | None = None) -> PendingRequest:
        """Put the request in the map: before anything can be sent."""
        if not self.admitted:
            raise RuntimeError(f"{self.method!r}: register before admission")
        self.entry = self.registry.register(self.method, self.ranks, self.policy,
                                            deadline=self.deadline, timeout=self.timeout,
                                            waiter=waiter)
        return self.entry

    def next_send(self) -> int | None:
        """The next rank to hand a frame to, already marked Sent; None when done.

        Ranks known to be lost are failed here (NotDelivered) instead of sent to.
        Stops early once the request is decided.
        """
        entry = self.entry
        if entry is None:
            raise RuntimeError(f"{self.method!r}: send before register")
        while self._next < len(entry.ranks):
            if not entry.is_open:
                return None
            rank = entry.ranks[self._next]
            self._next += 1
            if self.is_lost is not None and self.is_lost(rank):
                from ctlwire.kernel.errors import NotDelivered

                self.registry.rank_failed(entry, rank, NotDelivered(rank, "lost (not sent)"))
                continue
            self.registry.mark_sent(entry, rank)
            return rank
        return None

    def release_all(self) -> list[int]:
        """Every rank :meth:`next_send` would still return, all at once and marked
        Sent: for a shell that hands the frames over without suspending in between.
        The shell must stop handing over once the request is no longer open.

        Ranks known to be lost are failed (NotDelivered) instead, in order, as
        :meth:`next_send` does; stops early if that decides the request. A frame
        that cannot be handed over without waiting must be :meth:`withheld` before
        the shell suspends.
        """
        entry = self.entry
        if entry is None:
            raise RuntimeError(f"{self.method!r}: send before register")
        ranks = entry.ranks
        start = self._next
        is_lost = self.is_lost
        if start >= len(ranks) or not entry.is_open:
            return []
        if is_lost is None or not any(map(is_lost, ranks[start:])):
            # the common case: one transition for the batch
            out = list(ranks[start:])
            self._next = len(ranks)
            self.registry.mark_sent_all(entry, out)
            return out
        out = []
        while (rank := self.next_send()) is not None:
            out.append(rank)
        return out

    def withheld(self, rank: int) -> None:
        """The frame for ``rank``, released by :meth:`release_all`, was not handed over
        (it must wait for room or a first contact): until it is marked sent again
        (:meth:`resend`), a loss of ``rank`` means NotDelivered."""
        assert self.entry is not None
        self.registry.unmark_sent(self.entry, rank)

    def resend(self, rank: int) -> None:
        """The frame for a :meth:`withheld` rank is about to be handed over."""
        assert self.entry is not None
        self.registry.mark_sent(self.entry, rank)

    def send_failed(self, rank: int, error: Exception) -> bool:
        """The frame for ``rank`` could not be handed over. True when this decided
        the request (the shell must wake its waiters)."""
        assert self.entry is not None
        return self.registry.rank_failed(self.entry, rank, error)

    def begin_wait(self) -> bool:
        """The caller reaches its wait. False when there is nothing to wait for
        (the outcome is known: a reply beat the wait, or every send failed)."""
        assert self.entry is not None
        return self.registry.mark_awaiting(self.entry) or self.entry.is_open

    def deadline_passed(self) -> bool:
        """The wait ended at the deadline: TimedOut if still undecided."""
        assert self.entry is not None
        return self.registry.expire(self.entry)

    # -- cleanup -----------------------------------------------------------------
    def finish(self) -> Ticket | None:
        """On every path out: release the entry (Cancelled if undecided, then
        Cleaned) and leave the mailbox. Returns the ticket admitted by hand-off,
        whose waiter the shell must wake."""
        entry, self.entry = self.entry, None
        if entry is not None:
            self.registry.release(entry)
        if self.queue is not None and self.ticket is not None:
            return self.queue.leave(self.ticket)
        return None


class HandOffWaiter:
    """The waiter a queueing holder registers for its request. :meth:`set` is
    called when the request is decided (every wake-up of a request's waiter is: the
    reply that completes it, the failed send or lost rank that decides it, its
    expiry, the client's close): it leaves the mailbox, wakes the caller that admitted
    first, then the holder (``inner``). Leaving again (``set`` twice, or
    :meth:`CallCore.finish` later) is a no-op. ``wait`` is the inner waiter's.

    It holds the queue and the ticket, not the core: the core refers to the entry
    and the entry to this waiter, so holding the core would make a cycle.
    """

    __slots__ = ("inner", "queue", "ticket")

    def __init__(self, core: CallCore, inner: Any) -> None:
        if core.queue is None or core.ticket is None:
            raise ValueError("a HandOffWaiter is for a caller of a queueing mailbox")
        self.queue = core.queue
        self.ticket = core.ticket
        self.inner = inner

    def set(self) -> None:
        admitted = self.queue.leave(self.ticket)
        if admitted is not None:
            admitted.waiter.set()
        self.inner.set()

    def wait(self) -> Any:
        """The inner waiter's ``wait()`` (an awaitable)."""
        return self.inner.wait()
