"""A fan-out over your own sends and your own receive loop: :class:`OwnIoFanOut`.

::

    fan = OwnIoFanOut(sock.send_pyobj, slots=4)     # a synchronous __init__ may build it
    result = await fan.call(FlushCache(), timeout=5.0)   # a FanOutResult, one slot a reply
    ...
    fan.deliver(reply)                              # your receive loop, for each reply

ctlwire sends nothing and receives nothing here: the caller's ``send`` hands a
request to its own socket, and its receive loop hands each reply over with
:meth:`OwnIoFanOut.deliver`. Replies need carry no request id and no rank: the
i-th reply after a request went out fills its slot i (or the slot
``slot_of(reply)`` names). So requests go out one at a time:

* **Register before send.** A request is in the request map (its states are
  the ``ControlRequest`` table's) before ``send`` is called; a reply delivered
  during ``send`` itself (an engine in the same process) completes it.
* **Strict arrival order, sent on the tick it is admitted.** Calls are admitted
  first come, first served by the sans-IO core of
  :class:`~ctlwire.kernel.primitives.admission_gate.AdmissionGate`. A request is
  sent by the call itself when nothing is in flight, else by the
  :meth:`~OwnIoFanOut.deliver` that completes its predecessor: no task has to
  wake up first, and no caller can slip in between.
* **Drained before the next.** The next request goes out only once every slot
  of the one in flight has its reply, whether its callers still wait, timed out
  or were cancelled: a late reply is never taken for the next request's (it is
  dropped and counted). :meth:`~OwnIoFanOut.reset` gives up on replies that will
  never come.
* **A call's failure is its own.** A call cancelled or timed out while queued is
  never sent; a ``send`` that raises fails its own call with that exception and
  the next request goes out.
* **One deadline per call**, queueing included: RequestTimedOut (``admission=True``
  when nothing was sent; else with the slots that answered in ``partial``).
* **Typed per-slot results.** A :class:`~ctlwire.kernel.core.fan_out_result.FanOutResult`
  (slot = rank): each value as it was handed over (nothing encoded; ``codec``:
  replies are encoded values, decoded as ``result_type``), an error reply
  (``deliver(reply, error=...)``) as RemoteError, of the exception's class when
  the fan-out allows it (the builtins' by default).
* **Watching.** ``mode="watching"`` shares the request in flight (``joins``: the
  same request only, or any concurrent call) through a
  :class:`~ctlwire.kernel.primitives.coalescer.Coalescer`; every caller gets its
  own copy (``copy``, a deep copy by default; with a codec, its own decode) and
  ``result.joined`` says whether it joined.
* **Nothing left behind, nothing in the background.** Every request is cleaned
  whatever ends its call; no task runs and no loop is bound until a call runs.
  :meth:`~OwnIoFanOut.close` fails every call with ClientClosed.

Call :meth:`~OwnIoFanOut.call` and :meth:`~OwnIoFanOut.deliver` from the event
loop's thread (asyncio or trio).
"""

from __future__ import annotations

import copy as copying
import logging
import math
from collections.abc import Callable, Collection, Hashable
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar

import anyio
import msgspec

from ctlwire.kernel.client.call_arguments import checked_timeout
from ctlwire.kernel.client.call_outcome import CallOutcomes
from ctlwire.kernel.core.admission_queue import AdmissionQueue, Ticket
from ctlwire.kernel.core.fan_out_policy import Policy
from ctlwire.kernel.core.fan_out_result import FanOutResult
from ctlwire.kernel.core.request_registry import (
    PendingRequest,
    ReplyDisposition,
    RequestRegistry,
)
from ctlwire.kernel.errors import (
    ClientClosed,
    NotDelivered,
    OutcomeUnknown,
    RequestTimedOut,
    allowed_exceptions,
    error_info,
)
from ctlwire.kernel.primitives.coalescer import Coalescer, Joins, checked_joins
from ctlwire.states import RequestState, TicketState
from ctlwire.transports.codec import Codec
from ctlwire.transports.envelope import ErrorInfo, Reply

__all__ = ["OwnIoFanOut"]

log = logging.getLogger("ctlwire.client")

Req = TypeVar("Req")
Mode = Literal["queueing", "watching"]
_MODES = ("queueing", "watching")
_UNSET: Any = object()
_NO_RESULT = msgspec.Raw(b"")


class _AsIs:
    """Values handed over as they are (no codec): what ``CallOutcomes`` decodes with."""

    def fast_value_codec(self, tp: Any = Any
                         ) -> tuple[Callable[[Any], bytes], Callable[[Any], Any]] | None:
        return None

    def decode_value(self, raw: Any, tp: Any = Any) -> Any:
        return raw


class _Request:
    """A registered request and what became of its sending (its ticket's waiter)."""

    __slots__ = ("entry", "error", "payload", "ticket")

    def __init__(self, entry: PendingRequest, payload: Any) -> None:
        self.entry = entry
        self.payload = payload
        self.ticket: Ticket | None = None
        self.error: Exception | None = None  # what ``send`` raised


class _InFlight:
    """The request holding the fan-out until every slot has its reply."""

    __slots__ = ("answered", "entry", "ticket")

    def __init__(self, entry: PendingRequest, ticket: Ticket) -> None:
        self.entry = entry
        self.ticket = ticket
        self.answered: set[int] = set()


def _checked_slots(slots: Any) -> int:
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise ValueError(f"slots must be a positive int, not {slots!r}")
    return slots


def _checked_mode(mode: Any) -> Mode:
    if mode not in _MODES:
        raise ValueError(f"mode must be 'queueing' or 'watching', not {mode!r}")
    checked: Mode = mode
    return checked


class OwnIoFanOut(Generic[Req]):
    """A fan-out of ``slots`` replies per request over the caller's own I/O, one
    request in flight, strictly in arrival order, each drained before the next.

    ``send(request)`` hands a request to the caller's socket (read at each send,
    so it can be replaced); the receive loop calls :meth:`deliver` with each
    reply. ``mode``: ``"queueing"`` (each call its own request) or ``"watching"``
    (share the request in flight; ``joins``: ``"identical"`` requests only, by
    ``key=`` or the request itself, or ``"any"``). ``timeout``: the default
    deadline of a call (None: none). ``codec``: replies are encoded values,
    decoded as ``result_type``; without, values are passed as they are (a
    watcher's copy is ``copy(value)``). ``slot_of(reply)``: the slot a reply
    fills (default: arrival order). ``remote_exceptions``: as for
    :class:`~ctlwire.kernel.client.control_client.ControlClient`.
    """

    def __init__(self, send: Callable[[Req], object], slots: int, *,
                 mode: Mode = "queueing", joins: Joins = "identical",
                 timeout: float | None = None, name: str = "fan_out",
                 codec: Codec | None = None, result_type: Any = Any,
                 slot_of: Callable[[Any], int] | None = None,
                 copy: Callable[[Any], Any] | None = copying.deepcopy,
                 remote_exceptions: Collection[type[Exception]] | None = None,
                 max_tombstones: int = 1000) -> None:
        self.send = send
        self._slots = _checked_slots(slots)
        self.mode: Mode = _checked_mode(mode)
        self.timeout = math.inf if timeout is None else checked_timeout(timeout)
        self.name = name
        self.codec = codec
        self.result_type = result_type
        self.slot_of = slot_of
        self.copy = copy
        #: the request map: every request from registration to cleanup
        self.registry = RequestRegistry(max_tombstones=max_tombstones)
        #: first come, first served (the admission gate's core)
        self.queue = AdmissionQueue(name)
        #: the requests shared in watching mode
        self.coalescer: Coalescer[PendingRequest] = Coalescer(checked_joins(joins))
        self.outcomes = CallOutcomes(codec if codec is not None else _AsIs(),
                                     lambda: self._closed, allowed_exceptions(remote_exceptions))
        #: ``unexpected``: replies while nothing was in flight (dropped); ``stray``:
        #: replies naming no slot; ``send_failed``; ``reset``: requests given up on
        self.counters = dict.fromkeys(("unexpected", "stray", "send_failed", "reset"), 0)
        self._requests: dict[int, _Request] = {}
        self._in_flight: _InFlight | None = None
        self._sending = False
        self._closed = False

    # -- state ---------------------------------------------------------------------------
    @property
    def slots(self) -> int:
        """Replies per request: requests registered from now on collect this many
        (ValueError unless a positive int)."""
        return self._slots

    @slots.setter
    def slots(self, slots: int) -> None:
        self._slots = _checked_slots(slots)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> PendingRequest | None:
        """The request whose replies are being collected (None: nothing sent is
        outstanding)."""
        flight = self._in_flight
        return None if flight is None else flight.entry

    @property
    def depth(self) -> int:
        """Requests waiting to be sent."""
        return self.queue.depth

    # -- a call --------------------------------------------------------------------------
    async def call(self, request: Req, *, timeout: float | None = None,
                   mode: Mode | None = None, key: Hashable = _UNSET) -> FanOutResult:
        """Send ``request`` (when its turn comes) and return every slot's reply.

        ``timeout`` (seconds) overrides the default; ``mode`` the fan-out's;
        ``key``: what identical watching requests share (default: the request,
        encoded when there is a codec). Raises RequestTimedOut, FanOutFailed (a
        slot could not answer), ClientClosed, or what ``send`` raised; TypeError
        or ValueError for bad arguments, before anything is registered."""
        if self._closed:
            raise ClientClosed(f"{self.name} is closed")
        budget = self.timeout if timeout is None else checked_timeout(timeout)
        watching = (self.mode if mode is None else _checked_mode(mode)) == "watching"
        deadline = anyio.current_time() + budget
        registry = self.registry
        shared: Hashable = None
        if watching:
            shared = self._shared_key(request, key)
            entry, started = self.coalescer.share(
                shared, lambda: self._register(request, budget, deadline))
            if not started:
                registry.retain(entry)
        else:
            entry, started = self._register(request, budget, deadline), True
        try:
            if started:
                self._arrive(entry)
            await self._wait(entry, deadline)
            return self._outcome(entry, budget, started)
        finally:
            self._leave(entry)
            if watching:
                self.coalescer.done(shared, entry)

    def _shared_key(self, request: Any, key: Hashable) -> Hashable:
        if self.coalescer.joins == "any":
            return None  # every concurrent call shares: the key plays no part
        if key is not _UNSET:
            return key
        if self.codec is not None:
            return bytes(self.codec.encode_value(request))
        hash(request)  # TypeError for an unhashable request: pass key=
        identical: Hashable = request
        return identical

    def _register(self, request: Any, budget: float, deadline: float) -> PendingRequest:
        entry = self.registry.register(self.name, tuple(range(self._slots)), Policy.ALL,
                                       deadline=deadline, timeout=budget, waiter=anyio.Event())
        self._requests[entry.id] = _Request(entry, request)
        return entry

    def _arrive(self, entry: PendingRequest) -> None:
        """Queue ``entry``'s request; send it now if nothing is in flight (raising what
        ``send`` raised)."""
        request = self._requests[entry.id]
        ticket = request.ticket = self.queue.arrive(request)
        if ticket.state is TicketState.ADMITTED and not self._send(ticket):
            self._pass_on(ticket)
            if request.error is not None:
                raise request.error

    def _send(self, ticket: Ticket) -> bool:
        """Send the admitted request of ``ticket``. True when it now holds the fan-out;
        False when nothing is outstanding (it was decided already, its send failed,
        or every reply came during the send): the caller passes the fan-out on."""
        request: _Request = ticket.waiter
        entry = request.entry
        if not entry.is_open:
            return False
        slots = self.registry.plan_sends(entry)  # marked Sent before the send: replies find it
        flight = self._in_flight = _InFlight(entry, ticket)
        self._sending = True
        try:
            self.send(request.payload)
            for slot in slots:
                self.registry.sent(entry, slot)
        except Exception as exc:
            self._in_flight = None
            self.counters["send_failed"] += 1
            request.error = exc
            for slot in entry.outstanding():
                self.registry.rank_failed(entry, slot, NotDelivered(slot, f"send raised {exc!r}"))
            entry.wake()
            return False
        finally:
            self._sending = False
        return self._in_flight is flight

    def _pass_on(self, ticket: Ticket) -> None:
        """``ticket``'s request is drained (or was never sent): send the next ones, in
        order, until one holds the fan-out (its callers already wait for it)."""
        nxt = self.queue.leave(ticket)
        while nxt is not None and not self._send(nxt):
            nxt = self.queue.leave(nxt)
        if nxt is not None:
            self.registry.awaiting(nxt.waiter.entry)

    async def _wait(self, entry: PendingRequest, deadline: float) -> None:
        if not entry.is_open:
            return
        registry = self.registry
        registry.awaiting(entry)
        waiter = entry.waiter
        assert isinstance(waiter, anyio.Event)
        shared_deadline = entry.deadline if entry.deadline is not None else math.inf
        with anyio.CancelScope(deadline=min(deadline, shared_deadline)):
            await waiter.wait()
        if entry.is_open and entry.deadline is not None and anyio.current_time() >= entry.deadline:
            registry.expire(entry)  # its own deadline (not only a watcher's): it timed out
            entry.wake()

    def _outcome(self, entry: PendingRequest, budget: float, started: bool) -> FanOutResult:
        outcomes = self.outcomes
        if entry.is_open:  # this watcher's deadline came before the shared request's
            raise RequestTimedOut(self.name, budget, entry.id,
                                  partial=outcomes.fan_out_result(entry, self.result_type))
        error = self._requests[entry.id].error
        if error is not None:
            raise error
        if entry.state is RequestState.TIMED_OUT and not entry.sent_ranks:
            raise RequestTimedOut(self.name, budget, admission=True)
        if self._closed and any(type(e) is ClientClosed for e in entry.errors.values()):
            raise ClientClosed(f"{self.name} closed")  # also after some slots answered
        result = outcomes.fan_out_outcome(entry, self.result_type)
        if self.codec is None and self.copy is not None and entry.refs > 1:
            copy = self.copy  # others still read the values: this caller gets its own
            result.results = {slot: copy(value) for slot, value in result.results.items()}
        result.joined = not started
        return result

    def _leave(self, entry: PendingRequest) -> None:
        """One holder is done; the last cleans the request, and takes a request never
        sent out of the queue (a request in flight is drained all the same)."""
        self.registry.release(entry)
        if entry.state is RequestState.CLEANED:
            request = self._requests.pop(entry.id)
            if request.ticket is not None and request.ticket.state is TicketState.QUEUED:
                self.queue.leave(request.ticket)

    # -- the receive loop's side ---------------------------------------------------------
    def deliver(self, reply: Any, *, error: BaseException | ErrorInfo | None = None
                ) -> ReplyDisposition:
        """One reply, as the receive loop got it: it fills the next slot of the
        request in flight (or ``slot_of(reply)``); ``error``: the reply says it
        failed with this exception. Never raises for a reply that does not belong:
        one while nothing is in flight is dropped and counted (``UNKNOWN``), one
        for a request already decided or cleaned is counted late. The reply that
        fills the last slot sends the next request."""
        flight = self._in_flight
        if flight is None:
            self.counters["unexpected"] += 1
            log.debug("%s: a reply while nothing is in flight, dropped: %s", self.name,
                      type(reply).__name__)
            return ReplyDisposition.UNKNOWN
        entry = flight.entry
        slots = len(entry.ranks)
        slot = len(flight.answered) if self.slot_of is None else self._slot(reply, slots)
        if slot < 0:
            return ReplyDisposition.STRAY
        if error is None:
            info, value = None, reply if self.codec is None else msgspec.Raw(reply)
        else:
            info = error if isinstance(error, ErrorInfo) else error_info(error)
            value = _NO_RESULT
        disposition, _ = self.registry.on_reply(Reply(entry.id, slot, 0, info is None, value,
                                                      info))
        if disposition is ReplyDisposition.COMPLETED:
            entry.wake()
        flight.answered.add(slot)
        if len(flight.answered) >= slots:  # drained: the next request goes out
            self._in_flight = None
            if not self._sending:  # (during a send, the sender passes it on)
                self._pass_on(flight.ticket)
        return disposition

    def _slot(self, reply: Any, slots: int) -> int:
        try:
            slot = self.slot_of(reply) if self.slot_of is not None else -1
        except Exception:
            slot = -1
        if type(slot) is not int or not 0 <= slot < slots:
            self.counters["stray"] += 1
            return -1
        return slot

    def reset(self) -> None:
        """Give up on the request in flight (its replies will never come: the
        engines restarted): its open slots fail OutcomeUnknown and the next request
        goes out. A reply of it that still comes is taken for the next request's."""
        flight = self._in_flight
        if flight is None:
            return
        self._in_flight = None
        self.counters["reset"] += 1
        entry = flight.entry
        for slot in entry.outstanding() if entry.is_open else ():
            if self.registry.rank_failed(entry, slot, OutcomeUnknown(slot, "given up (reset)")):
                entry.wake()
        self._pass_on(flight.ticket)

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Every call ends with ClientClosed, now; later calls raise it. Replies that
        still come are dropped and counted."""
        if self._closed:
            return
        self._closed = True
        for entry in self.registry.fail_open(lambda slot: ClientClosed(f"{self.name} closed")):
            entry.wake()
        flight, self._in_flight = self._in_flight, None
        if flight is not None:
            self._pass_on(flight.ticket)  # nothing more is sent: every request is decided

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> OwnIoFanOut[Req]:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
