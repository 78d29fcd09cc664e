"""One call's IO: register, hand frames to the transport, wait, decode (anyio shell).

:class:`CallIssuer` drives the sans-IO request map
(:class:`~ctlwire.kernel.core.request_registry.RequestRegistry`) directly, with
the awaits between its steps. A call to one rank is a fan-out to one rank:
``ControlClient.call`` and every fan-out mode (admitted first by the method's
:class:`~ctlwire.kernel.primitives.admission_gate.AdmissionGate` when queueing)
are one path, :meth:`CallIssuer.issue`, which registers, then takes the two steps
a watching fan-out takes too, :meth:`send_all` and :meth:`wait_outcome`::

    entry = issuer.register("pause", (0, 1), Policy.ALL, budget=5.0)
    try:
        await issuer.send_all(entry, raw)     # raw: issuer.encode_payload(...)
        await issuer.wait_outcome(entry, entry.deadline)
        return issuer.outcomes.fan_out_outcome(entry, result_type)
    finally:
        issuer.registry.release(entry)

Guarantees:

* **Register before send.** :meth:`send_all` hands a frame over only for a
  rank the request map planned (registered and marked Sent), so a reply can
  never find its request missing.
* **Nothing sent for a cancelled or closed caller.** :meth:`issue` checks for
  cancellation before anything is registered, and :meth:`send_all` raises
  ClientClosed once :meth:`close` was called.
* **Sends are bounded.** A send waiting for room (high-water mark) or for a
  rank's first contact ends by the request's deadline, and is abandoned as
  soon as the request is decided or the rank is lost (:meth:`fail_rank`); the
  other ranks are still sent to
  (:class:`~ctlwire.kernel.client.waiting_sends.WaitingSends`). A frame never
  handed over fails its rank with NotDelivered; one handed over, then lost,
  with OutcomeUnknown.
* **Waits end by their deadline.** :meth:`wait_outcome` arms the
  :class:`~ctlwire.kernel.client.deadline_reaper.DeadlineReaper` with the
  request's own deadline (one task for thousands of waits instead of a timer
  per call), or bounds the wait itself when the caller's deadline is earlier or
  the reaper is not running.
* **Every outcome typed** (:class:`~ctlwire.kernel.client.call_outcome.CallOutcomes`).

Mechanisms kept because they pay: a fan-out's frames are handed over inside the
transport's ``batched_sends()`` (one readiness re-check for the burst instead of
one per rank); a fan-out to many ranks encodes its request once as a template
into which each rank's ``rank`` and ``seq`` are spliced (one encode instead of
one per rank); a caller of one rank waiting alone receives its reply itself (the
client's receiver: the reply reaches its caller without waking the receive loop
first).
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import anyio.lowlevel
import msgspec

from ctlwire.kernel.client.call_outcome import CallOutcomes
from ctlwire.kernel.client.deadline_reaper import DeadlineReaper
from ctlwire.kernel.client.liveness_monitor import LivenessMonitor
from ctlwire.kernel.client.progress_callbacks import ProgressCallback, ProgressCallbacks
from ctlwire.kernel.client.receiver import ClientReceiver
from ctlwire.kernel.client.waiting_sends import WaitingSends, send_error
from ctlwire.kernel.core.fan_out_policy import Policy
from ctlwire.kernel.core.request_registry import PendingRequest, RequestRegistry
from ctlwire.kernel.errors import (
    BUILTIN_EXCEPTIONS,
    ClientClosed,
    NotDelivered,
    OutcomeUnknown,
    RequestTimedOut,
    RequestTooLarge,
)
from ctlwire.kernel.observability.tracing import TraceProvider
from ctlwire.kernel.primitives.admission_gate import AdmissionGate
from ctlwire.states import PeerState
from ctlwire.transports.codec import PayloadTypeError
from ctlwire.transports.envelope import NO_DEADLINE, Request
from ctlwire.transports.errors import (
    OversizedFrame,
    TransportError,
)
from ctlwire.transports.task_waits import current_backend
from ctlwire.transports.transport import ClientTransport

__all__ = ["CallIssuer"]

#: fan-outs to this many ranks or more encode the request once, as a template into
#: which each rank's ``rank`` and ``seq`` are spliced (cutting it costs ~5 encodes)
_SPLICE_MIN_RANKS = 16
# generous stand-ins for the header fields when sizing a request envelope
_MAX_ID = 2**63 - 1
_ENVELOPE_SLACK = 512


def _no_fast_encoder(value: Any) -> bytes:
    raise TypeError("no fast encoder: the codec's encode_value decides")


class CallIssuer:
    """Runs the IO of one client's calls; see the module docstring.

    ``fence`` is the client's fencing token (0: none), used unless a call sets
    its own (``send_all(..., fence=)``). ``first_contact_retry`` paces
    the re-tries of a send to a rank never heard from. ``exceptions``: the classes
    an engine's error is raised as (:class:`CallOutcomes`).
    """

    def __init__(self, transport: ClientTransport, registry: RequestRegistry,
                 liveness: LivenessMonitor, counters: dict[str, int],
                 on_closed: Callable[[], Awaitable[None]], *, fence: int = 0,
                 trace_provider: TraceProvider | None = None,
                 first_contact_retry: float = 0.25,
                 exceptions: Mapping[str, type[Exception]] = BUILTIN_EXCEPTIONS) -> None:
        self.transport = transport
        self.codec = transport.codec
        self.registry = registry
        self._incarnation = registry.incarnation  # fixed for the registry's life
        self.liveness = liveness
        self.peers = liveness.peers
        self.fence = fence
        self.trace_provider = trace_provider
        self.closed = False
        #: the clock of anyio's cancel-scope deadlines
        self.now: Callable[[], float] = anyio.current_time
        #: the clock of the deadlines the envelopes carry
        self.wall_clock: Callable[[], float] = time.time
        #: decodes and types each holder's outcome
        self.outcomes = CallOutcomes(transport.codec, lambda: self.closed, exceptions)
        #: the ``on_progress`` callbacks of the calls in flight
        self.progress_callbacks = ProgressCallbacks()
        #: ends the waits of requests and admission tickets at their deadlines (one task)
        self.reaper = DeadlineReaper(registry, PendingRequest.wake)
        #: makes the waiter one caller parks on (the running loop's, set when the
        #: client starts: :func:`~ctlwire.transports.task_waits.current_backend`)
        self.new_waiter: Callable[[], Any] = anyio.Event
        #: raises the caller's pending cancellation (the running loop's, set when the
        #: client starts)
        self.checkpoint_if_cancelled: Callable[[], Awaitable[None]] = (
            anyio.lowlevel.checkpoint_if_cancelled)
        #: the receive loop, where every call waits: a caller waiting alone receives
        #: its reply itself (``counters``: the client's; ``on_closed``: awaited when
        #: the transport closes under it)
        self.receiver = ClientReceiver(transport, registry, liveness, counters, on_closed,
                                       self.progress_callbacks)
        #: the sends that wait for room or for a rank's first contact
        self.waiting_sends = WaitingSends(transport, registry, liveness, lambda: self.closed,
                                          lambda: self.now(), first_contact_retry)
        self._seq: dict[int, int] = {}
        #: the codec's encoder; without a size check when it has a fast one
        self._encode: Callable[[Request], bytes] = (
            self.codec.fast_envelope_encoder() or self.codec.encode)
        self._limit = self.codec.max_message_size
        #: the codec's value encoder without a wrapper, if it has one
        fast_value = self.codec.fast_value_codec()
        self._encode_value: Callable[[Any], bytes] = (
            fast_value[0] if fast_value is not None else _no_fast_encoder)

    def bind_loop(self) -> Callable[[], float]:
        """Take the running event loop's clock and waiter (call it in the loop, when
        the client starts); returns the clock."""
        backend = current_backend()
        self.now = backend.clock
        self.new_waiter = backend.new_waiter
        self.checkpoint_if_cancelled = backend.checkpoint_if_cancelled
        self.receiver.bind(backend)
        return self.now

    def close(self) -> None:
        """Every request in flight fails ClientClosed (its waiters and a send blocked
        on its behalf are woken); further calls raise ClientClosed."""
        self.closed = True
        for entry in self.registry.fail_open(lambda rank: ClientClosed("client closed")):
            entry.wake()

    # -- the steps of one call -------------------------------------------------
    def encode_payload(self, payload: Any, method: str = "") -> msgspec.Raw:
        """The payload encoded once for every rank; raises RequestTooLarge when
        the whole request envelope (header, method name, payload) cannot fit."""
        if self.closed:
            raise ClientClosed("client is closed")
        try:
            raw = msgspec.Raw(self._encode_value(payload))
        except Exception:  # (no fast encoder, or it refused) the codec's typed verdict
            try:
                raw = self.codec.encode_value(payload)
            except PayloadTypeError as exc:
                raise TypeError(f"payload cannot be encoded: {exc}") from None
        limit = self.codec.max_message_size
        # cheap bound first: a header of ids and floats, a trace carrier, the name
        if len(raw) + 4 * len(method) + _ENVELOPE_SLACK > limit:
            trace = self.trace_provider() if self.trace_provider is not None else None
            probe = Request(_MAX_ID, _MAX_ID, method, raw, time.time() + 1e9, _MAX_ID, _MAX_ID,
                            trace)
            try:
                self.codec.encode(probe)
            except OversizedFrame as exc:
                raise RequestTooLarge(method, exc.size, limit) from None
        return raw

    def register(self, method: str, ranks: tuple[int, ...], policy: Policy, budget: float,
                 deadline: float | None = None, waiter: Any = None) -> PendingRequest:
        """One call's entry in the request map, woken through ``waiter`` (default: the
        one-task waiter made when the caller first has to wait, see :func:`waiter_of`);
        whoever registers releases it on every path out."""
        if self.closed:
            raise ClientClosed("client is closed")
        return self.registry.register(
            method, ranks, policy, deadline=self.now() + budget if deadline is None else deadline,
            timeout=budget, waiter=waiter)

    async def issue(self, method: str, raw: msgspec.Raw, ranks: tuple[int, ...],
                    policy: Policy, budget: float, deadline: float, result_type: Any,
                    key: str = "", fence: int | None = None, *,
                    gate: AdmissionGate | None = None,
                    on_progress: ProgressCallback | None = None,
                    left_out: dict[int, str] | None = None,
                    wall_deadline: float | None = None, one_rank: bool = False) -> Any:
        """One request, its outcome returned or raised: a :class:`FanOutResult`, or
        with ``one_rank`` the one rank's result (``ControlClient.call``). Admitted
        first by ``gate`` when given (first come, first served, its ``holders`` in
        flight: sent in admission order, its slot passed on at the decision, the
        outcome returned in admission order; see
        :mod:`~ctlwire.kernel.client.fan_out_mailbox`), at once without.
        ``on_progress`` hears this request's progress only; ``left_out``: the
        present ranks it does not address, and why (its observers see them);
        ``wall_deadline``: ``deadline`` on :attr:`wall_clock`, for the envelopes
        (None: read from the clocks when sending; infinite: none)."""
        ticket = None
        if gate is not None:
            ticket = await gate.enter(deadline, budget, check_cancelled=False)
        entry: PendingRequest | None = None
        try:
            # the one checkpoint before anything is registered: a caller cancelled before
            # it got here (even one handed the gate, then cancelled before it resumed)
            # raises now, and leaving the gate passes it on
            await self.checkpoint_if_cancelled()
            if self.closed:
                raise ClientClosed("client is closed")
            entry = self.registry.register(method, ranks, policy, deadline=deadline,
                                           timeout=budget)
            entry.left_out = left_out
            if on_progress is not None:
                self.progress_callbacks.by_id[entry.id] = on_progress
            await self.send_all(entry, raw, key, fence, wall_deadline)
            if gate is not None and ticket is not None:
                # every frame is handed over (or never will be): the next caller may
                # send, and the decision of this request passes its slot on
                gate.started(ticket)
                hand_off = gate.hand_off(ticket, self.new_waiter())
                if entry.is_open:
                    entry.waiter = hand_off
                else:
                    hand_off.set()  # decided while sending
            await self.wait_outcome(entry, deadline)
            if (gate is not None and ticket is not None and not gate.queue.turn(ticket)
                    and not await gate.wait_turn(ticket, deadline)):
                # its deadline passed while a caller admitted earlier had not returned
                raise RequestTimedOut(method, budget, entry.id,
                                      partial=self.outcomes.fan_out_result(entry, result_type))
            if one_rank:
                return self.outcomes.single_outcome(entry, ranks[0], result_type)
            return self.outcomes.fan_out_outcome(entry, result_type)
        finally:
            if entry is not None:
                if on_progress is not None:
                    self.progress_callbacks.by_id.pop(entry.id, None)
                self.registry.release(entry)
            if gate is not None and ticket is not None:
                gate.leave(ticket)

    async def send_all(self, entry: PendingRequest, raw: msgspec.Raw, key: str = "",
                       fence: int | None = None, wall_deadline: float | None = None) -> None:
        """Hand ``entry``'s request to the transport for each rank the request map
        plans (registered and marked Sent first); ``key`` and ``fence`` go in
        its envelopes (``fence`` None: the client's). Raises ClientClosed once
        :meth:`close` was called.

        Frames are handed over in rank order without suspending until one cannot
        be (a rank at its high-water mark, or not connected yet): that send waits,
        bounded by the request's deadline and abandoned when that rank is lost or
        the request decided, then the rest follow, one by one. Until its frame is
        handed over a rank counts as not sent (a loss means NotDelivered).
        """
        if self.closed:
            raise ClientClosed("client is closed")
        peers = self.peers
        ranks = self.registry.plan_sends(
            entry, peers.is_lost if peers.lost_count or peers.retired else None)
        fence = self.fence if fence is None else fence
        if len(ranks) > 1:
            with self.transport.batched_sends():
                waiting = self._send_now(entry, ranks, raw, key, fence, wall_deadline)
        else:
            waiting = self._send_now(entry, ranks, raw, key, fence, wall_deadline)
        if waiting:
            await self.waiting_sends.send(entry, waiting)
        if not entry.is_open:
            entry.wake()

    def _send_now(self, entry: PendingRequest, ranks: list[int], raw: msgspec.Raw, key: str,
                  fence: int, wall_deadline: float | None) -> list[tuple[int, Request]] | None:
        """Hand the frames over, in rank order, until one cannot be without waiting
        (never suspends). Returns that rank and those after it, with their frames
        (None: all handed over or failed)."""
        if wall_deadline is None:
            # the wall-clock deadline the envelopes carry (NO_DEADLINE: none)
            wall_deadline = NO_DEADLINE
            if entry.timeout and entry.deadline is not None:
                remaining = entry.deadline - self.now()
                if math.isfinite(remaining):
                    wall_deadline = self.wall_clock() + remaining
        elif wall_deadline == math.inf:
            wall_deadline = NO_DEADLINE
        incarnation = self._incarnation
        trace = self.trace_provider() if self.trace_provider is not None else None
        rid = entry.id
        method = entry.method
        seqs = self._seq
        sent = self.registry.sent
        # encoded bytes straight to the transport (no envelope object per rank where
        # the template is spliced, no frame list); the envelope only for a send that waits
        send_encoded, encode, limit = self.transport.send_encoded_nowait, self._encode, self._limit
        splice = None
        if len(ranks) >= _SPLICE_MIN_RANKS:
            splice = self.codec.request_splicer(Request(
                rid, 0, method, raw, wall_deadline, 0, incarnation, trace, key, fence))
        waiting: list[tuple[int, Request]] | None = None
        for rank in ranks:
            if not entry.is_open:
                break  # decided (a failed send): the rest are not handed over
            seq = seqs[rank] = seqs.get(rank, 0) + 1
            if waiting is None:
                try:
                    data = (splice(rank, seq) if splice is not None else encode(Request(
                        rid, rank, method, raw, wall_deadline, seq, incarnation, trace, key,
                        fence)))
                    if len(data) > limit:
                        raise OversizedFrame(len(data), limit)
                    send_encoded(rank, data)
                    sent(entry, rank)
                    continue
                except TransportError as exc:
                    error = send_error(rank, exc, self.peers.state(rank) is PeerState.LOST)
                    if error is not None:
                        if self.registry.rank_failed(entry, rank, error):
                            entry.wake()
                        continue
                waiting = []  # for room, or the rank's first contact: this one and the rest
            waiting.append((rank, Request(rid, rank, method, raw, wall_deadline, seq,
                                          incarnation, trace, key, fence)))
        return waiting

    async def wait_outcome(self, entry: PendingRequest, deadline: float) -> None:
        """Wait until ``entry`` is decided or ``deadline`` (anyio clock) passes.

        Expires the request only when its own deadline has passed; a watcher
        with an earlier personal deadline just stops waiting.
        """
        if not (self.registry.awaiting(entry) or entry.is_open):
            return  # decided already: a reply beat the wait, or every send failed
        entry_deadline = entry.deadline if entry.deadline is not None else math.inf
        if deadline >= entry_deadline and self.reaper.scope is not None:
            # the request's own deadline ends this wait: the reaper expires it and
            # wakes us (no cancel scope and no timer per call)
            self.reaper.arm(entry, entry_deadline)
            await self.receiver.wait(entry)
            return
        with anyio.CancelScope(deadline=deadline):
            await self.receiver.wait(entry)
        if entry.is_open and self.now() >= entry_deadline:
            self.registry.expire(entry)

    def abandon_unsent(self, entry: PendingRequest) -> None:
        """The caller sending ``entry`` left before handing every frame over (others
        share the request): each rank not handed over fails NotDelivered now."""
        registry = self.registry
        for rank in entry.outstanding():
            if rank not in entry.sent_ranks and registry.rank_failed(
                    entry, rank, NotDelivered(rank, "not sent: the caller sending it left")):
                entry.wake()

    def fail_rank(self, rank: int, detail: str) -> None:
        """``rank`` is lost (or restarted): its requests fail, typed by whether each
        frame was handed over; sends waiting at that rank give up."""
        for entry in self.registry.fail_rank(
                rank, lambda r: OutcomeUnknown(r, detail),
                lambda r: NotDelivered(r, f"{detail} (not sent)")):
            entry.wake()
        self.waiting_sends.abandon_rank(rank)
