"""First-come-first-served admission to a queueing fan-out mailbox (sans-IO).

:class:`AdmissionQueue` is the synchronous core of
:class:`~ctlwire.kernel.primitives.admission_gate.AdmissionGate` (and so of a
queueing :class:`~ctlwire.kernel.client.fan_out_mailbox.FanOutMailbox`). It hands
out :class:`Ticket` objects that move through the ``MailboxTicket`` table:
Queued → Admitted → Started → Decided → Released, or Queued → Abandoned.

``holders`` (k, default 1) is how many admitted tickets may hold a *slot* at
once: a ticket holds one from its admission until it is decided (its work
decided: a client's request) or leaves.

Guarantees:

* **At most k slots, one start at a time.** At most ``holders`` tickets are
  Admitted or Started, and at most one is Admitted: a ticket is admitted only
  once the ticket admitted before it has started (:meth:`start`), been decided
  or left. So whatever holders do before they start (a client: hand its frames
  to the transport) happens in admission order, even when it waits.
* **Strict arrival order.** Tickets are admitted in the order :meth:`arrive`
  was called, skipping only tickets abandoned while queued.
* **Hand-off, not wake-up.** The call that frees what a queued ticket waits for
  (:meth:`start`, :meth:`decide`, :meth:`leave`) admits the next ticket *itself*,
  before that ticket's task has resumed, and returns it. A caller arriving in
  the wake-up window therefore queues behind; it cannot overtake (SGLang's
  ``FanOutCommunicator`` bug).
* **Leaving in admission order.** :meth:`turn` says whether every ticket admitted
  before this one has left; :meth:`next_out` names the oldest admitted ticket
  that has not left (the shell wakes its ``turn_waiter`` after each leave, so
  that holders that wait for their turn leave in admission order).
* **No hang.** Whatever way a holder leaves (return, exception, cancellation,
  even cancellation after being admitted but before resuming), its
  :meth:`leave` frees its slot and turn. Abandoning a queued ticket never
  changes the order of the others.

The shell calls :meth:`arrive`, waits on the ticket's waiter if it is queued,
calls :meth:`resumed` when its task runs again, :meth:`start` once its first
step is done, :meth:`decide` when its work is decided
(:class:`~ctlwire.kernel.primitives.admission_gate.HandOffWaiter`) and
:meth:`leave` on every path out (a no-op the second time); it wakes the ticket
each of them returns.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ctlwire.states import MAILBOX_TICKET_TABLE, TicketEvent, TicketState

__all__ = ["AdmissionQueue", "Ticket", "TicketObserver", "checked_holders"]

_QUEUED = TicketState.QUEUED
_ADMITTED = TicketState.ADMITTED
_STARTED = TicketState.STARTED
_DECIDED = TicketState.DECIDED


class Ticket:
    """One caller's place in a mailbox. Mutated only by its queue (``waiter`` and
    ``turn_waiter``: by the shell that parks on them)."""

    __slots__ = ("resumed", "seq", "state", "turn_waiter", "waiter")

    def __init__(self, seq: int, waiter: Any) -> None:
        self.seq = seq
        self.state = TicketState.QUEUED
        #: what the caller parks on while queued (woken by its admission)
        self.waiter = waiter
        #: what the caller parks on while it waits for its turn to leave
        self.turn_waiter: Any = None
        #: the caller's task ran again after its admission (:meth:`AdmissionQueue.resumed`)
        self.resumed = False

    def __repr__(self) -> str:
        return f"<Ticket #{self.seq} {self.state.name}>"


TicketObserver = Callable[[Ticket, TicketState, TicketEvent, TicketState], None]


def checked_holders(holders: Any) -> int:
    """``holders`` if it is an int >= 1 (not a bool); ValueError otherwise."""
    if isinstance(holders, bool) or not isinstance(holders, int) or holders < 1:
        raise ValueError(f"holders must be an int >= 1, not {holders!r}")
    return holders


class AdmissionQueue:
    """FIFO admission core; see the module docstring for its guarantees."""

    def __init__(self, name: str = "", observer: TicketObserver | None = None, *,
                 holders: int = 1) -> None:
        self.name = name
        self.holders = checked_holders(holders)
        self._seq = 0
        self._queue: OrderedDict[int, Ticket] = OrderedDict()
        #: admitted tickets that have not left, in admission order
        self._admitted: OrderedDict[int, Ticket] = OrderedDict()
        #: tickets holding a slot (Admitted or Started)
        self.in_flight = 0
        #: the ticket whose turn to start it is (Admitted), if any
        self.starting: Ticket | None = None
        self.admitted_total = 0
        self.abandoned_total = 0
        self.observers: list[TicketObserver] = [observer] if observer else []
        self._apply = MAILBOX_TICKET_TABLE.apply

    @property
    def depth(self) -> int:
        """Tickets waiting (not counting the holders)."""
        return len(self._queue)

    @property
    def busy(self) -> bool:
        """A ticket holds a slot."""
        return self.in_flight > 0

    @property
    def holder(self) -> Ticket | None:
        """The oldest ticket holding a slot (with one slot: the holder), or None."""
        if not self.in_flight:
            return None
        for ticket in self._admitted.values():
            if ticket.state is not _DECIDED:
                return ticket
        return None  # pragma: no cover - in_flight counts these

    def queued(self) -> list[Ticket]:
        return list(self._queue.values())

    def admitted(self) -> list[Ticket]:
        """The admitted tickets that have not left, in admission order."""
        return list(self._admitted.values())

    def _go(self, ticket: Ticket, event: TicketEvent) -> None:
        old = ticket.state
        ticket.state = self._apply(old, event, ticket.seq)
        for observer in self.observers:
            observer(ticket, old, event, ticket.state)

    def _admit(self, ticket: Ticket) -> None:
        self._go(ticket, TicketEvent.ADMIT)
        self._admitted[ticket.seq] = ticket
        self.in_flight += 1
        self.starting = ticket
        self.admitted_total += 1

    def _admit_next(self) -> Ticket | None:
        """Admit the first queued ticket if a slot is free and no one is starting."""
        if self.starting is None and self.in_flight < self.holders and self._queue:
            _, nxt = self._queue.popitem(last=False)
            self._admit(nxt)
            return nxt
        return None

    def arrive(self, waiter: Any = None) -> Ticket:
        """A new ticket: Admitted at once if a slot is free, no one is starting and
        nobody is queued, else Queued at the back."""
        self._seq += 1
        ticket = Ticket(self._seq, waiter)
        if self.starting is None and self.in_flight < self.holders and not self._queue:
            self._admit(ticket)
        else:
            self._queue[ticket.seq] = ticket
        return ticket

    def resumed(self, ticket: Ticket) -> None:
        """The ticket's task runs again after its wait. Admission already
        happened at hand-off; this only checks it (raises AssertionError if the
        shell lost track)."""
        if ticket.state is not _ADMITTED or self._admitted.get(ticket.seq) is not ticket:
            raise AssertionError(f"{ticket!r} resumed without holding mailbox {self.name!r}")
        ticket.resumed = True

    def start(self, ticket: Ticket) -> Ticket | None:
        """The ticket's first step is done (a client: its frames are handed over, or
        never will be): the next ticket may be admitted. Returns the ticket this
        admitted (the shell wakes it), or None; a no-op unless ``ticket`` is Admitted."""
        if ticket.state is not _ADMITTED:
            return None
        self._go(ticket, TicketEvent.START)
        self.starting = None
        return self._admit_next()

    def decide(self, ticket: Ticket) -> Ticket | None:
        """The ticket's work is decided (it started, if it had not): its slot passes
        on, it keeps its place in the order of leaving. Returns the ticket this
        admitted, or None; a no-op unless ``ticket`` is Admitted or Started."""
        state = ticket.state
        if state is not _STARTED and state is not _ADMITTED:
            return None
        self._go(ticket, TicketEvent.DECIDE)
        if self.starting is ticket:
            self.starting = None
        self.in_flight -= 1
        return self._admit_next()

    def leave(self, ticket: Ticket) -> Ticket | None:
        """The ticket's caller is done, however it ended. Returns the ticket
        admitted by hand-off (the caller must wake it), or None. A caller waiting
        for its turn to leave is named by :meth:`next_out` afterwards."""
        state = ticket.state
        if state is _QUEUED:
            del self._queue[ticket.seq]
            self._go(ticket, TicketEvent.ABANDON)
            self.abandoned_total += 1
            return None
        if state is _DECIDED:
            self._go(ticket, TicketEvent.RELEASE)
            del self._admitted[ticket.seq]
            return None
        if state is _ADMITTED or state is _STARTED:
            self._go(ticket, TicketEvent.RELEASE)
            del self._admitted[ticket.seq]
            if self.starting is ticket:
                self.starting = None
            self.in_flight -= 1
            return self._admit_next()
        return None  # already released or abandoned: leaving twice is harmless

    def turn(self, ticket: Ticket) -> bool:
        """Every ticket admitted before ``ticket`` has left (its turn to leave)."""
        for seq in self._admitted:
            return seq == ticket.seq
        return False

    def next_out(self) -> Ticket | None:
        """The oldest admitted ticket that has not left: its turn to leave has come
        (its caller may be waiting for it), or None."""
        for first in self._admitted.values():
            return first
        return None

    def check_invariants(self) -> None:
        """Raise AssertionError when the queue's state is inconsistent."""
        admitted = list(self._admitted.values())
        holding = [t for t in admitted if t.state is _ADMITTED or t.state is _STARTED]
        starting = [t for t in admitted if t.state is _ADMITTED]
        assert self.in_flight == len(holding) <= self.holders, "slots miscounted"
        assert len(starting) <= 1, f"{starting} start at once"
        assert self.starting is (starting[0] if starting else None), "starting miscounted"
        assert all(t.state in (_ADMITTED, _STARTED, _DECIDED) for t in admitted)
        if self._queue:
            assert self.starting is not None or self.in_flight == self.holders, (
                "tickets queued while a slot is free and no one is starting")
        seqs = list(self._queue)
        assert seqs == sorted(seqs), "queue out of arrival order"
        assert list(self._admitted) == sorted(self._admitted), "admitted out of order"
        if seqs and admitted:
            assert admitted[-1].seq < seqs[0], "a queued ticket arrived before an admitted one"
        assert all(t.state is _QUEUED for t in self._queue.values())
