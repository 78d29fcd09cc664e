"""FaultyClientTransport: a ClientTransport that injects a plan's faults."""

from __future__ import annotations

import math
from collections.abc import Callable
from types import TracebackType

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ctlwire.testing.faults._faults import _PASS, FaultPlan
from ctlwire.testing.faults._faulty_base import _FaultyBase
from ctlwire.testing.faults._injector import FaultInjector
from ctlwire.transports.codec import Codec
from ctlwire.transports.envelope import Envelope, Request
from ctlwire.transports.errors import TransportClosed, TransportError, Unroutable
from ctlwire.transports.event_stream import receive_event, receive_events
from ctlwire.transports.transport import (
    ClientTransport,
    PeerDisconnected,
    Received,
    TransportEvent,
)

__all__ = ["FaultyClientTransport"]


class FaultyClientTransport(_FaultyBase, ClientTransport):
    """A :class:`ClientTransport` that injects the faults of ``plan`` (a
    :class:`FaultPlan`, or a :class:`FaultInjector` to share) into ``inner``.

    ``send`` direction: client to engines; ``receive``: engines to client.
    Received events are pumped by a task of the wrapper into an unbounded
    buffer. :meth:`partition`, :meth:`heal` and :meth:`close` inject by hand.
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
            self.faults.bump("closed")
            self._out.close()

    def _on_close_fault(self) -> None:
        self.close()

    def _notify_partition(self, rank: int) -> None:
        self.faults.bump("partition_notices")
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
        self._check()
        return await receive_event(self._in)

    async def receive_many(self, limit: int = 64) -> list[TransportEvent]:
        """The next event (waiting for one) and those buffered behind it, up to ``limit``."""
        self._check()
        return await receive_events(self._in, limit)

    # -- the receive side ---------------------------------------------------------------
    def _put(self, event: TransportEvent) -> None:
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
        receive_many = self.inner.receive_many
        while True:
            try:
                events = await receive_many()
            except TransportClosed:
                self._out.close()
                return
            for event in events:
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
                faults.bump("disconnects_suppressed")
            else:
                if event.rank is not None:
                    self._disconnected(event.rank)
                self._put(event)
        else:
            self._put(event)
