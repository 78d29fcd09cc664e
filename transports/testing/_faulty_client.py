"""FaultyClientTransport: a ClientTransport that injects a plan's faults."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable
from functools import partial
from types import TracebackType
from typing import Any, cast

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ctlwire.transports.codec import Codec
from ctlwire.transports.envelope import Envelope, Request
from ctlwire.transports.errors import TransportClosed, TransportError, Unroutable
from ctlwire.transports.testing._faults import _PASS, FaultPlan
from ctlwire.transports.testing._faulty_base import _FaultyBase
from ctlwire.transports.testing._injector import FaultInjector
from ctlwire.transports.transport import (
    ClientTransport,
    PeerDisconnected,
    Received,
    TransportEvent,
)

__all__ = ["FaultyClientTransport"]

_RAISED = cast(Any, object())
"""Buffered in place of an event whose handler raised where it arrived."""
_INTERRUPTED = cast(Any, object())
"""Buffered by interrupt_receive(): the suspended receive asks its ``until`` again."""


class _Declined:
    """Buffered in place of an event the handler declined where it arrived."""

    __slots__ = ("event",)

    def __init__(self, event: TransportEvent) -> None:
        self.event = event


class FaultyClientTransport(_FaultyBase):
    """A :class:`ClientTransport` that injects the faults of ``plan`` (a
    :class:`FaultPlan`, or a :class:`FaultInjector` to share) into ``inner``.

    ``send`` direction: client to engines; ``receive``: engines to client.
    Received events are pumped by a task of the wrapper into an unbounded
    buffer. :meth:`partition`, :meth:`heal` and :meth:`close` inject by hand.

    :meth:`receive_or_handle` is forwarded: the pump takes events from the
    wrapped transport's own ``receive_or_handle`` when it has one (on asyncio the
    ZeroMQ transport's reader callback), and once a receiver has registered its
    ``handle``, an event that reaches the client while nothing is buffered is
    handed to it where it arrives (the pump, or the delay line for a delayed
    frame), as the real transport does; buffered events keep their order.
    """

    def __init__(self, inner: ClientTransport, plan: FaultPlan | FaultInjector | None = None
                 ) -> None:
        super().__init__(plan)
        self.inner = inner
        self.codec: Codec = inner.codec
        send, recv = anyio.create_memory_object_stream[TransportEvent](math.inf)
        self._epochs: dict[int, int] = {}
        self._out: MemoryObjectSendStream[TransportEvent] = send
        self._in: MemoryObjectReceiveStream[TransportEvent] = recv
        # the receiver's handler (receive_or_handle), and what it raised when the
        # pump called it: raised by the receive that finds _RAISED in the buffer
        self._handle: Callable[[TransportEvent], bool] | None = None
        self._handle_errors: list[BaseException] = []
        self.handled_inline = 0
        """Events handed to the receiver's handler where they arrived."""
        #: the ``until`` of the receive suspended now, if it has one
        self._receiving_until: Callable[[], bool] | None = None
        self._interrupt_queued = False

    async def __aenter__(self) -> FaultyClientTransport:
        await self._enter(self.inner)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self._closed = True
        self._out.close()
        try:
            await self._stop_tasks()
        finally:
            await self.inner.__aexit__(exc_type, exc, tb)
            self._in.close()

    # -- faults by hand -----------------------------------------------------------
    def partition(self, rank: int, *, notify: bool = False) -> None:
        """Cut ``rank`` off now (silently, unless ``notify``) until :meth:`heal`."""
        self.faults.partition(rank)
        if notify:
            self._notify_partition(rank)

    def heal(self, rank: int) -> None:
        """End ``rank``'s partition: its frames (and heartbeats) flow again."""
        self.faults.heal(rank)

    def close(self) -> None:
        """Close the transport as the client sees it: sends and :meth:`receive`
        raise TransportClosed from now on (the wrapped transport is closed on exit)."""
        if not self._closed:
            self._closed = True
            self.faults._bump("closed")
            self._out.close()

    def _on_close_fault(self) -> None:
        self.close()

    def _notify_partition(self, rank: int) -> None:
        self.faults._bump("partition_notices")
        self._put(PeerDisconnected(rank, "partitioned (fault injection)"))

    # -- ClientTransport -------------------------------------------------------------
    def _check(self) -> None:
        if self._closed:
            raise TransportClosed("transport is closed (fault injection)")

    def send_nowait(self, rank: int, envelope: Envelope) -> None:
        self._check()
        verdict = self.faults.decide("send", rank, envelope)
        try:
            if verdict is _PASS:
                self.inner.send_nowait(rank, envelope)
                self._release_held("send", rank)
                return
            self._route("send", rank, verdict, lambda: self.inner.send_nowait(rank, envelope),
                        self._send_later(rank, envelope))
        except Unroutable:
            self._disconnected(rank)
            raise

    async def send(self, rank: int, envelope: Envelope) -> None:
        self._check()
        verdict = self.faults.decide("send", rank, envelope)
        try:
            if verdict is _PASS:
                await self.inner.send(rank, envelope)
                self._release_held("send", rank)
                return
            later = self._send_later(rank, envelope)
            if verdict.delays and verdict.hold is None and verdict.delays[0] <= 0:
                await self.inner.send(rank, envelope)  # the first copy waits for room
                for _ in verdict.delays[1:]:
                    later()
                self._release_held("send", rank)
                return
            self._route("send", rank, verdict, later, later)
        except Unroutable:
            self._disconnected(rank)
            raise

    def _disconnected(self, rank: int) -> None:
        """The connection to ``rank`` ended: what it still carried (delayed or
        held frames) is lost with it."""
        self._epochs[rank] = self._epochs.get(rank, 0) + 1

    def _send_later(self, rank: int, envelope: Envelope) -> Callable[[], None]:
        epoch = self._epochs.get(rank, 0)

        def deliver() -> None:
            if (self._closed or self.faults.is_partitioned(rank)
                    or self._epochs.get(rank, 0) != epoch):
                self._lost("send", envelope)
                return
            try:
                self.inner.send_nowait(rank, envelope)
            except Unroutable:
                self._disconnected(rank)
                self._lost("send", envelope)
            except TransportError:
                self._lost("send", envelope)

        return deliver

    async def receive(self) -> TransportEvent:
        got = await self._next()
        assert got is not None  # only a receive with ``until`` ends empty
        return got[0]

    async def _next(self, until: Callable[[], bool] | None = None
                    ) -> tuple[TransportEvent, bool] | None:
        """The next buffered event, and whether the handler already declined it
        (None: ``until()`` became True first)."""
        self._check()
        while True:
            if until is not None and until():
                return None
            self._receiving_until = until
            try:
                event: Any = await self._in.receive()  # or a _Declined, _RAISED, _INTERRUPTED
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                raise TransportClosed("transport is closed") from None
            finally:
                self._receiving_until = None
            if event is not _INTERRUPTED:
                break
            self._interrupt_queued = False
        if event is _RAISED:
            raise self._handle_errors.pop(0)
        if type(event) is _Declined:
            return event.event, True
        return event, False

    async def receive_or_handle(self, handle: Callable[[TransportEvent], bool],
                                until: Callable[[], bool] | None = None
                                ) -> TransportEvent | None:
        """:meth:`receive`, except that each event is first passed to ``handle(event)``,
        in order, which returns True when it handled it; returns the first event
        ``handle`` declines. Events that arrive while nothing is buffered are handed
        to ``handle`` where they arrive, without waking this task; an exception it
        raises there is raised here. ``until`` as for the ZeroMQ client transport:
        None as soon as ``until()`` is True, asked before each event, before the
        receive suspends and after each event handed over where it arrived;
        :meth:`interrupt_receive` makes a suspended one ask again. (Unlike the ZeroMQ
        transport's, this hand-over goes on after a receive returned: events that
        arrive while nothing is buffered reach ``handle`` once it is registered.)"""
        self._handle = handle
        while True:
            got = await self._next(until)
            if got is None:
                return None
            event, declined = got
            if declined or not handle(event):
                return event

    def interrupt_receive(self) -> None:
        """Make a suspended :meth:`receive_or_handle` with ``until`` ask it again
        (a marker through the buffer: nothing buffered is passed over)."""
        if (self._receiving_until is not None and not self._interrupt_queued
                and not self._closed):
            self._interrupt_queued = True
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._out.send_nowait(_INTERRUPTED)

    # -- the receive side ---------------------------------------------------------------
    def _put(self, event: TransportEvent) -> None:
        handle = self._handle
        if (handle is not None and not self._closed
                and not self._out.statistics().current_buffer_used):
            try:
                if handle(event):
                    self.handled_inline += 1
                    until = self._receiving_until
                    if until is not None and until():
                        self.interrupt_receive()  # the suspended receive ends now
                    return
                event = cast(Any, _Declined(event))  # returned, not handed over again
            except Exception as exc:  # the receiver raises it (its event was received)
                self._handle_errors.append(exc)
                event = _RAISED
        try:
            self._out.send_nowait(event)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            if type(event) is Received:
                self._lost("receive", event.envelope)

    def _received_later(self, event: Received, rank: int) -> Callable[[], None]:
        epoch = self._epochs.get(rank, 0)

        def deliver() -> None:
            if self.faults.is_partitioned(rank) or self._epochs.get(rank, 0) != epoch:
                self._lost("receive", event.envelope)
            else:
                self._put(event)

        return deliver

    async def _pump(self) -> None:
        inner = self.inner
        if hasattr(type(inner), "receive_or_handle"):
            # the wrapped transport's own hand-over path (its reader callback on
            # asyncio): every event goes through the faults from there
            def take(event: TransportEvent) -> bool:
                self._pump_one(event)
                return True

            receive: Callable[[], Awaitable[TransportEvent]] = partial(
                inner.receive_or_handle, take)  # type: ignore[attr-defined]
        else:
            receive = inner.receive
        while True:
            try:
                event = await receive()
            except TransportClosed:
                self._out.close()
                return
            self._pump_one(event)

    def _pump_one(self, event: TransportEvent) -> None:
        """One event from the wrapped transport, through the receive-side faults."""
        faults = self.faults
        if type(event) is Received:
            env = event.envelope
            if isinstance(env, Request):
                self._put(event)  # not something an engine sends: the kernel counts it
                return
            rank = event.peer if event.peer is not None else env.rank
            verdict = faults.decide("receive", rank, env)
            if verdict is _PASS:
                self._put(event)
                self._release_held("receive", rank)
            else:
                later = self._received_later(event, rank)
                self._route("receive", rank, verdict, later, later)
        elif type(event) is PeerDisconnected:
            if event.rank is not None and faults.is_partitioned(event.rank):
                faults._bump("disconnects_suppressed")
            else:
                if event.rank is not None:
                    self._disconnected(event.rank)
                self._put(event)
        else:
            self._put(event)
