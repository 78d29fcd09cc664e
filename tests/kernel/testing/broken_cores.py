"""Deliberately broken cores (tests only): the two production bugs, rebuilt on ctlwire's cores.

The interleaving explorer must catch each of them with a short counterexample
(``tests/kernel/testing/test_interleavings.py``); that is what shows the checker can fail.

* :class:`WakeupWindowQueue` -- SGLang's ``FanOutCommunicator.queueing_call``:
  the leaving holder pops the next waiter and wakes it *without* admitting it;
  admission happens only when the woken task runs (``resumed``). Meanwhile
  ``arrive`` admits anyone who finds no holder and an empty queue, so a caller
  arriving in the wake-up window overtakes the woken one.
* :class:`RegisterAfterSendCore` with :class:`LateRegistry` -- FastDeploy's
  ``run_control_method``: the request id is chosen first and travels with the
  frame, but the reply slot enters the request map only after the send. A fast
  reply finds no slot: it is dropped as late (FastDeploy: "req_id not in
  req_dict, caching response") and the caller waits until its timeout.
* :class:`HandOffOnSendCore` -- passes the mailbox on once its frames are out
  (when it starts waiting) instead of at the decision: the next caller's request
  goes out while this one is still undecided (two in flight at once).
* :class:`SilentLeaveQueue` -- its ``leave`` admits the next caller but does not
  return it, so nobody wakes it (a lost wake-up; the decision's hand-off is the
  first ``leave``).
* :class:`ForgetfulRegistry` -- a registry that forgets ids once their
  tombstone is evicted: a late reply after the eviction is UNKNOWN (ctlwire
  recognises every id it ever issued). Only the full search (no reduction)
  reaches it: it needs a late reply to wait for two later calls to finish.
"""

from __future__ import annotations

from typing import Any

from ctlwire.kernel.core.admission_queue import AdmissionQueue, Ticket
from ctlwire.kernel.core.call_core import CallCore
from ctlwire.kernel.core.fan_out_policy import Policy
from ctlwire.kernel.core.request_registry import (
    PendingRequest,
    ReplyDisposition,
    RequestRegistry,
    Waiter,
)
from ctlwire.states import TicketEvent, TicketState
from ctlwire.transports.envelope import Reply

__all__ = ["ForgetfulRegistry", "HandOffOnSendCore", "LateRegistry", "RegisterAfterSendCore",
           "SilentLeaveQueue", "WakeupWindowQueue"]


class WakeupWindowQueue(AdmissionQueue):
    """Wake-up instead of hand-off (SGLang's bug); see the module docstring."""

    def arrive(self, waiter: Any = None) -> Ticket:
        self._seq += 1
        ticket = Ticket(self._seq, waiter)
        if self.holder is None and not self._queue:  # "looks free": the window
            self._admit(ticket)
        else:
            self._queue[ticket.seq] = ticket
        return ticket

    def resumed(self, ticket: Ticket) -> None:
        if ticket.state is TicketState.QUEUED:  # woken earlier: admitted only now
            self._admit(ticket)

    def leave(self, ticket: Ticket) -> Ticket | None:
        if ticket.state is TicketState.QUEUED:
            self._queue.pop(ticket.seq, None)  # it may have been popped and woken already
            self._go(ticket, TicketEvent.ABANDON)
            self.abandoned_total += 1
            return None
        if ticket.state is TicketState.ADMITTED:
            self._go(ticket, TicketEvent.RELEASE)
            if self.holder is ticket:
                self.holder = None
            if self._queue:
                _, nxt = self._queue.popitem(last=False)
                return nxt  # woken, NOT admitted: the mailbox looks free meanwhile
        return None


class LateRegistry(RequestRegistry):
    """A registry that can hand out an entry (and its id) before the entry is in
    the request map (:meth:`reserve`), and put it there later (:meth:`insert`)."""

    def reserve(self, method: str, ranks: tuple[int, ...], policy: Policy = Policy.ALL, *,
                deadline: float | None = None, timeout: float = 0.0,
                waiter: Waiter | None = None) -> PendingRequest:
        entry = self.register(method, ranks, policy, deadline=deadline, timeout=timeout,
                              waiter=waiter)
        del self._live[entry.id]  # the id stays issued; the slot is not there yet
        for rank in entry.ranks:
            bucket = self._by_rank[rank]
            del bucket[entry.id]
            if not bucket:
                del self._by_rank[rank]
        return entry

    def insert(self, entry: PendingRequest) -> None:
        self._live[entry.id] = entry
        for rank in entry.ranks:
            self._by_rank.setdefault(rank, {})[entry.id] = entry


class RegisterAfterSendCore(CallCore):
    """Send first, register the reply slot after (FastDeploy's bug); needs a
    :class:`LateRegistry`. See the module docstring."""

    def register(self, waiter: Waiter | None = None) -> PendingRequest:
        if not self.admitted:
            raise RuntimeError(f"{self.method!r}: register before admission")
        registry = self.registry
        assert isinstance(registry, LateRegistry)
        self.entry = registry.reserve(self.method, self.ranks, self.policy,
                                      deadline=self.deadline, timeout=self.timeout,
                                      waiter=waiter)
        self._inserted = False
        return self.entry

    def next_send(self) -> int | None:
        entry = self.entry
        assert entry is not None
        if self._next < len(entry.ranks):
            rank = entry.ranks[self._next]
            self._next += 1
            return rank  # the frame carries entry.id, which is not in the map yet
        if not self._inserted:  # after the send: now the reply slot exists
            registry = self.registry
            assert isinstance(registry, LateRegistry)
            registry.insert(entry)
            for rank in entry.ranks:
                registry.mark_sent(entry, rank)
            self._inserted = True
        return None


class ForgetfulRegistry(RequestRegistry):
    """Knows only live ids and tombstones; see the module docstring."""

    def on_reply(self, reply: Reply, peer: int | None = None
                 ) -> tuple[ReplyDisposition, PendingRequest | None]:
        if self.get(reply.id) is None and reply.id not in self._tombstones:
            self.stats.unknown += 1
            return ReplyDisposition.UNKNOWN, None
        return super().on_reply(reply, peer)


class HandOffOnSendCore(CallCore):
    """Hand-off when the wait begins, not at the decision; see the module docstring."""

    def begin_wait(self) -> bool:
        waiting = super().begin_wait()
        if self.queue is not None and self.ticket is not None:
            admitted = self.queue.leave(self.ticket)
            if admitted is not None:
                admitted.waiter.set()
        return waiting


class SilentLeaveQueue(AdmissionQueue):
    """Admits the next caller on ``leave`` without reporting whom it admitted."""

    def leave(self, ticket: Ticket) -> Ticket | None:
        super().leave(ticket)
        return None
