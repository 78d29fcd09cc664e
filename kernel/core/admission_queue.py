"""First-come-first-served admission to a queueing fan-out mailbox (sans-IO).

:class:`AdmissionQueue` is the synchronous core of
:class:`~ctlwire.kernel.client.fan_out_mailbox.FanOutMailbox` in queueing mode. It
hands out :class:`Ticket` objects that move through the ``MailboxTicket``
table: Queued → Admitted → Released, or Queued → Abandoned.

Guarantees:

* **At most one holder.** At most one ticket is Admitted at any time.
* **Strict arrival order.** Tickets are admitted in the order :meth:`arrive`
  was called, skipping only tickets abandoned while queued.
* **Hand-off, not wake-up.** :meth:`leave` of the holder admits the next
  queued ticket *itself*, before that ticket's task has resumed. A caller
  arriving in the wake-up window therefore finds the mailbox held and queues
  behind; it cannot overtake (SGLang's ``FanOutCommunicator`` bug).
* **No hang.** Whatever way a holder leaves (return, exception, cancellation,
  even cancellation after being admitted but before resuming), its
  :meth:`leave` passes the mailbox on. Abandoning a queued ticket never
  changes the order of the others. A holder cancelled before it resumed sends
  nothing (the shell checks for cancellation before its first send).

The shell calls :meth:`arrive`, waits on the ticket's waiter if it is queued,
calls :meth:`resumed` when its task runs again, and calls :meth:`leave` when its
request is decided (:class:`~ctlwire.kernel.client.fan_out_mailbox.HandOffWaiter`) and
again in a ``finally`` (a no-op the second time); it wakes the ticket
:meth:`leave` returns.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ctlwire.states import MAILBOX_TICKET_TABLE, TicketEvent, TicketState

__all__ = ["AdmissionQueue", "Ticket", "TicketObserver"]


class Ticket:
    """One caller's place in a mailbox. Mutated only by its queue."""

    __slots__ = ("resumed", "seq", "state", "waiter")

    def __init__(self, seq: int, waiter: Any) -> None:
        self.seq = seq
        self.state = TicketState.QUEUED
        self.waiter = waiter
        #: the caller's task ran again after its admission (:meth:`AdmissionQueue.resumed`)
        self.resumed = False

    def __repr__(self) -> str:
        return f"<Ticket #{self.seq} {self.state.name}>"


TicketObserver = Callable[[Ticket, TicketState, TicketEvent, TicketState], None]


class AdmissionQueue:
    """FIFO admission core; see the module docstring for its guarantees."""

    def __init__(self, name: str = "", observer: TicketObserver | None = None) -> None:
        self.name = name
        self._seq = 0
        self._queue: OrderedDict[int, Ticket] = OrderedDict()
        self.holder: Ticket | None = None
        self.admitted_total = 0
        self.abandoned_total = 0
        self.observers: list[TicketObserver] = [observer] if observer else []
        self._apply = MAILBOX_TICKET_TABLE.apply

    @property
    def depth(self) -> int:
        """Tickets waiting (not counting the holder)."""
        return len(self._queue)

    @property
    def busy(self) -> bool:
        return self.holder is not None

    def queued(self) -> list[Ticket]:
        return list(self._queue.values())

    def _go(self, ticket: Ticket, event: TicketEvent) -> None:
        old = ticket.state
        ticket.state = self._apply(old, event, ticket.seq)
        for observer in self.observers:
            observer(ticket, old, event, ticket.state)

    def _admit(self, ticket: Ticket) -> None:
        self._go(ticket, TicketEvent.ADMIT)
        self.holder = ticket
        self.admitted_total += 1

    def arrive(self, waiter: Any = None) -> Ticket:
        """A new ticket: Admitted at once if the mailbox is free and nobody is
        queued, else Queued at the back."""
        self._seq += 1
        ticket = Ticket(self._seq, waiter)
        if self.holder is None and not self._queue:
            self._admit(ticket)
        else:
            self._queue[ticket.seq] = ticket
        return ticket

    def resumed(self, ticket: Ticket) -> None:
        """The ticket's task runs again after its wait. Admission already
        happened at hand-off; this only checks it (raises IllegalTransition
        semantics as AssertionError if the shell lost track)."""
        if ticket.state is not TicketState.ADMITTED or self.holder is not ticket:
            raise AssertionError(f"{ticket!r} resumed without holding mailbox {self.name!r}")
        ticket.resumed = True

    def leave(self, ticket: Ticket) -> Ticket | None:
        """The ticket's caller is done, however it ended. Returns the ticket
        admitted by hand-off (the caller must wake it), or None."""
        if ticket.state is TicketState.QUEUED:
            del self._queue[ticket.seq]
            self._go(ticket, TicketEvent.ABANDON)
            self.abandoned_total += 1
            return None
        if ticket.state is TicketState.ADMITTED:
            self._go(ticket, TicketEvent.RELEASE)
            self.holder = None
            if self._queue:
                _, nxt = self._queue.popitem(last=False)
                self._admit(nxt)
                return nxt
            return None
        return None  # already released or abandoned: leaving twice is harmless

    def check_invariants(self) -> None:
        """Raise AssertionError when the queue's state is inconsistent."""
        if self.holder is None:
            assert not self._queue, "tickets queued while the mailbox is free"
        else:
            assert self.holder.state is TicketState.ADMITTED
        seqs = list(self._queue)
        assert seqs == sorted(seqs), "queue out of arrival order"
        assert all(t.state is TicketState.QUEUED for t in self._queue.values())
