"""Deliberately broken cores (tests only): the two production bugs, rebuilt on ctlwire's cores.

The interleaving explorer must catch each of them with a short counterexample
(``tests/testing/test_interleavings.py``); that is what shows the checker can fail.

* :class:`WakeupWindowQueue` -- SGLang's ``FanOutCommunicator.queueing_call``:
  the leaving holder pops the next waiter and wakes it *without* admitting it;
  admission happens only when the woken task runs (``resumed``). Meanwhile
  ``arrive`` admits anyone who finds no holder and an empty queue, so a caller
  arriving in the wake-up window overtakes the woken one.
* :class:`RegisterAfterSendRegistry` -- FastDeploy's ``run_control_method``:
  the request id is chosen first and travels with the frame, but the reply slot
  enters the request map only after the send. A fast
  reply finds no slot: it is dropped as late (FastDeploy: "req_id not in
  req_dict, caching response") and the caller waits until its timeout.
* :class:`HandOffOnSendRegistry` -- passes the mailbox on once its frames are out
  (when it starts waiting) instead of at the decision: the next caller's request
  goes out while this one is still undecided (two in flight at once).
* :class:`SilentLeaveQueue` -- its ``decide`` and ``leave`` admit the next caller
  but do not return it, so nobody wakes it (a lost wake-up).
* :class:`StartAtOnceQueue` -- ordered pipelining that admits the next caller as
  soon as a slot is free, without waiting for the caller admitted before it to
  have handed its frames over: two callers send at once, and a rank can receive
  the later request first.
* :class:`ReturnAtDecisionQueue` -- ordered pipelining that lets every decided
  caller return at once (its turn always comes): a request decided early (a
  policy met sooner, replies out of order) completes before one admitted earlier.
* :class:`ForgetfulRegistry` -- a registry that forgets ids once their
  tombstone is evicted: a late reply after the eviction is UNKNOWN (ctlwire
  recognises every id it ever issued). Only the full search (no reduction)
  reaches it: it needs a late reply to wait for two later calls to finish.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ctlwire.kernel.core.admission_queue import AdmissionQueue, Ticket
from ctlwire.kernel.core.fan_out_policy import Policy
from ctlwire.kernel.core.request_registry import (
    PendingRequest,
    ReplyDisposition,
    RequestRegistry,
    Waiter,
)
from ctlwire.kernel.primitives.admission_gate import HandOffWaiter
from ctlwire.states import RequestEvent, TicketEvent, TicketState
from ctlwire.transports.envelope import Reply

__all__ = ["ForgetfulRegistry", "HandOffOnSendRegistry", "RegisterAfterSendRegistry",
           "ReturnAtDecisionQueue", "SilentLeaveQueue", "StartAtOnceQueue", "WakeupWindowQueue"]


class WakeupWindowQueue(AdmissionQueue):
    """Wake-up instead of hand-off (SGLang's bug); see the module docstring."""

    def _admit_next(self) -> Ticket | None:
        if self.starting is None and self.in_flight < self.holders and self._queue:
            _, nxt = self._queue.popitem(last=False)
            return nxt  # woken, NOT admitted: the mailbox looks free meanwhile
        return None

    def resumed(self, ticket: Ticket) -> None:
        if ticket.state is TicketState.QUEUED:  # woken earlier: admitted only now
            self._admit(ticket)

    def leave(self, ticket: Ticket) -> Ticket | None:
        if ticket.state is TicketState.QUEUED:
            self._queue.pop(ticket.seq, None)  # it may have been popped and woken already
            self._go(ticket, TicketEvent.ABANDON)
            self.abandoned_total += 1
            return None
        return super().leave(ticket)


class RegisterAfterSendRegistry(RequestRegistry):
    """Send first, put the reply slot in the map after (FastDeploy's bug): the
    entry and its id exist from :meth:`register`, the slot only once every frame
    is out. See the module docstring."""

    def register(self, method: str, ranks: Sequence[int], policy: Policy = Policy.ALL, *,
                 deadline: float | None = None, timeout: float = 0.0,
                 waiter: Waiter | None = None) -> PendingRequest:
        entry = super().register(method, ranks, policy, deadline=deadline, timeout=timeout,
                                 waiter=waiter)
        del self._live[entry.id]  # the id stays issued; the slot is not there yet
        for rank in entry.ranks:
            bucket = self._by_rank[rank]
            del bucket[entry.id]
            if not bucket:
                del self._by_rank[rank]
        return entry

    def plan_sends(self, entry: PendingRequest,
                   is_lost: Callable[[int], bool] | None = None) -> list[int]:
        return list(entry.ranks)  # the frames carry entry.id, which is not in the map yet

    def awaiting(self, entry: PendingRequest) -> bool:
        if self.get(entry.id) is None:  # after the send: now the reply slot exists
            self._live[entry.id] = entry
            for rank in entry.ranks:
                self._by_rank.setdefault(rank, {})[entry.id] = entry
            self._go(entry, RequestEvent.SEND)
        return super().awaiting(entry)


class ForgetfulRegistry(RequestRegistry):
    """Knows only live ids and tombstones; see the module docstring."""

    def on_reply(self, reply: Reply, peer: int | None = None
                 ) -> tuple[ReplyDisposition, PendingRequest | None]:
        if self.get(reply.id) is None and reply.id not in self._tombstones:
            self.stats.unknown += 1
            return ReplyDisposition.UNKNOWN, None
        return super().on_reply(reply, peer)


class HandOffOnSendRegistry(RequestRegistry):
    """Hand-off when the wait begins, not at the decision; see the module docstring."""

    def awaiting(self, entry: PendingRequest) -> bool:
        waiting = super().awaiting(entry)
        waiter = entry.waiter
        if isinstance(waiter, HandOffWaiter):
            admitted = waiter.queue.leave(waiter.ticket)
            if admitted is not None:
                admitted.waiter.set()  # (the holder also waits for its turn: none here)
        return waiting


class SilentLeaveQueue(AdmissionQueue):
    """Admits the next caller on a decision or ``leave`` without reporting whom it
    admitted."""

    def decide(self, ticket: Ticket) -> Ticket | None:
        super().decide(ticket)
        return None

    def leave(self, ticket: Ticket) -> Ticket | None:
        super().leave(ticket)
        return None


class StartAtOnceQueue(AdmissionQueue):
    """Admits whenever a slot is free, even while the caller admitted before is
    still sending; see the module docstring."""

    def _admit_next(self) -> Ticket | None:
        if self.in_flight < self.holders and self._queue:
            _, nxt = self._queue.popitem(last=False)
            self._admit(nxt)
            return nxt
        return None

    def arrive(self, waiter: object = None) -> Ticket:
        self._seq += 1
        ticket = Ticket(self._seq, waiter)
        if self.in_flight < self.holders and not self._queue:
            self._admit(ticket)
        else:
            self._queue[ticket.seq] = ticket
        return ticket


class ReturnAtDecisionQueue(AdmissionQueue):
    """Every caller's turn to return has come; see the module docstring."""

    def turn(self, ticket: Ticket) -> bool:
        return True
