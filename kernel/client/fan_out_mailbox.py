"""One method's fan-out mailbox: a FIFO admission gate, or shared watching (anyio shell).

Queueing mode: the method's :class:`~ctlwire.kernel.primitives.admission_gate.AdmissionGate`
(the public primitive, with its guarantees) admits concurrent callers strictly
in arrival order, ``pipeline_depth`` undecided requests in flight at most (the
client's ``pipeline``; default 1). The issuer enters the gate before it
registers, reports its frames handed over (the next caller may send: requests
go out in admission order, to every rank), passes its slot on the moment its
request is decided (its :class:`~ctlwire.kernel.primitives.admission_gate.HandOffWaiter`
wakes the next caller before the holder), waits for its turn to return (callers
complete in admission order) and leaves in its ``finally``. The whole call,
queueing included, is bounded by its deadline (RequestTimedOut with
``admission=True`` while still queued: nothing sent); a caller still queued
when the client closes gets ClientClosed at once. A caller cancelled after
being handed the mailbox but before it resumed sends nothing (its send's
checkpoint raises) and passes the mailbox on.

With a depth of k > 1 (ordered pipelining), for a caller:

* **Sent in admission order, to every rank.** A caller's frames go out only
  after those of every caller admitted before it (or once that caller gave up
  sending: cancelled, timed out, its request decided); one caller sends at a
  time, so a send that waits (for room, for first contact) is never overtaken.
  A rank's connection is FIFO, so every rank receives the requests in
  admission order. A ``retry=`` is a new request, admitted at the back.
* **Completed in admission order.** A caller returns its request's outcome (a
  result, FanOutFailed, ...) only after every caller admitted before it has
  returned or raised: a later request decided first (an engine that runs the
  method with ``concurrency > 1`` and replies out of order, a policy met
  early) waits for the earlier ones. Its own deadline still bounds its call: if
  it passes while the caller waits for an earlier one, the caller raises
  RequestTimedOut, its request's outcome in ``partial``.
* **A caller's failure is its own.** A caller cancelled, or timed out, while
  queued leaves the queue; one cancelled while its request is in flight leaves
  at once (its request stays sent: the engine still runs it, its reply is
  dropped as late) and frees its slot; one whose holder raises leaves at once.
  The others keep their order in both respects.
* **A rank lost with several requests in flight** fails each of them for that
  rank with OutcomeUnknown (each may have run); queued callers, sent later,
  fail it with NotDelivered. Each request is decided by its own policy, and
  the callers still complete in admission order.
* **The engine sees up to k requests of the method at once**: they start in
  arrival order, at most the method's ``concurrency`` at a time, and count
  against its lane and the connection's queue budgets (``Busy`` beyond).

Choose k > 1 for independent requests that the engine serializes anyway; keep
1 when a request's validity depends on the outcome of the one before it (with
k > 1 it is already sent by then).

Watching mode (:meth:`FanOutMailbox.watching`): a caller joins the request in
flight, through the public :class:`~ctlwire.kernel.primitives.coalescer.Coalescer`
(``joins="identical"``: the same payload, ranks and policy; ``"any"``: any
concurrent caller), instead of sending another; every caller receives its own
freshly decoded copy of the result, whose ``joined`` says whether it joined.
The shared request lives until its last watcher leaves, so the first caller's
cancellation does not take the answer away from the others. The pipeline
depth does not apply.

The mailbox talks to the client only through :class:`FanOutSender`, the
narrow interface of what it needs (the clock, the deadline reaper, and for
watching the steps of one fan-out); the client's
:class:`~ctlwire.kernel.client.call_issuer.CallIssuer` provides it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, Protocol

import anyio
import msgspec

from ctlwire.kernel.client.call_outcome import CallOutcomes
from ctlwire.kernel.client.deadline_reaper import DeadlineReaper
from ctlwire.kernel.core.admission_queue import checked_holders
from ctlwire.kernel.core.fan_out_policy import Policy
from ctlwire.kernel.core.fan_out_result import FanOutResult
from ctlwire.kernel.core.request_registry import PendingRequest, RequestRegistry
from ctlwire.kernel.errors import ClientClosed, RequestTimedOut
from ctlwire.kernel.primitives.admission_gate import AdmissionGate
from ctlwire.kernel.primitives.coalescer import Coalescer, Joins

__all__ = ["FanOutMailbox", "FanOutMailboxes", "FanOutMode", "FanOutSender"]

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

    @property
    def checkpoint_if_cancelled(self) -> Callable[[], Awaitable[None]]:
        """Raises the caller's pending cancellation (before anything is registered)."""

    def register(self, method: str, ranks: tuple[int, ...], policy: Policy, budget: float,
                 deadline: float | None = None, waiter: Any = None) -> PendingRequest:
        """One caller's entry in the request map (woken through ``waiter``)."""

    async def send_all(self, entry: PendingRequest, raw: msgspec.Raw, key: str = "",
                       fence: int | None = None) -> None:
        """Hand the frames to the transport for each rank the request map releases."""

    async def wait_outcome(self, entry: PendingRequest, deadline: float) -> None:
        """Wait until the request is decided or ``deadline`` passes."""

    def abandon_unsent(self, entry: PendingRequest) -> None:
        """The caller sending ``entry`` left: the ranks it did not hand over fail."""


class FanOutMailbox:
    """Admission of fan-outs of one method; created by ``ControlClient.mailbox``.
    ``pipeline_depth``: queueing fan-outs in flight at most (ValueError unless an
    int >= 1)."""

    def __init__(self, sender: FanOutSender, method: str, pipeline_depth: int = 1) -> None:
        self.sender = sender
        self.method = method
        #: queueing: first come, first served, ``pipeline_depth`` in flight (the
        #: client's clock, waiters, deadline reaper and closing)
        self.gate = AdmissionGate(method, host=sender, holders=pipeline_depth)
        self.queue = self.gate.queue
        #: watching: the shared requests in flight
        self.coalescer: Coalescer[PendingRequest] = Coalescer()

    @property
    def depth(self) -> int:
        """Callers waiting for admission."""
        return self.gate.depth

    @property
    def pipeline_depth(self) -> int:
        """Queueing fan-outs of this method in flight at most."""
        return self.gate.holders

    @property
    def watched(self) -> int:
        """Shared requests in flight in watching mode."""
        return self.coalescer.in_flight

    @property
    def watch_joins(self) -> int:
        """Watching callers that joined a request in flight instead of sending one."""
        return self.coalescer.joined_total

    async def watching(self, raw: msgspec.Raw, ranks: tuple[int, ...], policy: Policy,
                       budget: float, deadline: float, result_type: Any, key: str = "",
                       fence: int | None = None, joins: Joins = "identical",
                       left_out: dict[int, str] | None = None) -> FanOutResult:
        """Join a request in flight (``joins="identical"``: the same payload, ranks
        and policy; ``"any"``: whichever this method has in flight), or start one,
        and wait for it by ``deadline``; own copy of the result, whose ``joined``
        says which. ``key``, ``fence`` and ``left_out`` (the present ranks it does
        not address) go with a request this caller starts."""
        sender = self.sender
        if sender.closed:
            raise ClientClosed("client is closed")
        await sender.checkpoint_if_cancelled()  # a cancelled caller starts and joins nothing
        registry = sender.registry
        shared: _WatchKey = (bytes(raw), ranks, policy)
        def start() -> PendingRequest:
            new = sender.register(self.method, ranks, policy, budget, deadline, anyio.Event())
            new.left_out = left_out
            return new

        # several callers wait for it: an event, not a one-task waiter
        entry, started = self.coalescer.share(shared, start, joins)
        if not started:
            registry.retain(entry)  # a holder of the shared entry: only waits and releases
        try:
            if started:
                await sender.send_all(entry, raw, key, fence)
            await sender.wait_outcome(entry, deadline)
            if entry.is_open:  # our own deadline passed before the shared one
                raise RequestTimedOut(self.method, budget, entry.id,
                                      partial=sender.outcomes.fan_out_result(entry, result_type))
            result = sender.outcomes.fan_out_outcome(entry, result_type)
            result.joined = not started
            return result
        finally:
            if started and entry.is_open and entry.refs > 1:
                sender.abandon_unsent(entry)  # the others are not left waiting for frames
            registry.release(entry)
            self.coalescer.done(shared, entry)


class FanOutMailboxes:
    """The mailboxes of one client, one per method (created on first use).
    ``pipeline``: method -> its mailbox's pipeline depth (default 1); ValueError
    for a depth that is not an int >= 1 or a name that is not a non-empty string."""

    def __init__(self, sender: FanOutSender, pipeline: Mapping[str, int] | None = None) -> None:
        self.sender = sender
        self.by_method: dict[str, FanOutMailbox] = {}
        self.pipeline: dict[str, int] = {}
        for method, depth in (pipeline or {}).items():
            if not isinstance(method, str) or not method:
                raise ValueError(f"pipeline: a method name must be a non-empty string, "
                                 f"not {method!r}")
            try:
                self.pipeline[method] = checked_holders(depth)
            except ValueError:
                raise ValueError(f"pipeline[{method!r}] must be an int >= 1, "
                                 f"not {depth!r}") from None

    def get(self, method: str) -> FanOutMailbox:
        box = self.by_method.get(method)
        if box is None:
            box = self.by_method[method] = FanOutMailbox(
                self.sender, method, self.pipeline.get(method, 1))
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
            box.gate.close()
