"""FaultyEngineTransport: an EngineTransport for one rank that injects a plan's faults."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from types import TracebackType

import anyio

from ctlwire.transports.codec import Codec
from ctlwire.transports.envelope import Envelope, Reply
from ctlwire.transports.errors import TransportClosed, TransportError
from ctlwire.transports.testing._faults import _PASS, FaultPlan
from ctlwire.transports.testing._faulty_base import _FaultyBase
from ctlwire.transports.testing._injector import FaultInjector
from ctlwire.transports.transport import (
    EngineTransport,
    PeerDisconnected,
    Received,
    Route,
    TransportEvent,
)

__all__ = ["FaultyEngineTransport"]

class FaultyEngineTransport(_FaultyBase, EngineTransport):
    """An :class:`EngineTransport` for one rank that injects the faults of
    ``plan`` into ``inner``.

    ``send`` direction: engine to client; ``receive``: client to engine.
    :meth:`partition` / :meth:`heal` cut this rank off and back; the plan's
    ``close_at`` closes the wrapped transport (the client sees the engine
    disconnect). Works from an event loop (``async with``, :meth:`receive`)
    and from a synchronous poll loop, which releases delayed frames when it
    polls.
    """

    def __init__(self, inner: EngineTransport, plan: FaultPlan | FaultInjector | None = None
                 ) -> None:
        super().__init__(plan)
        self.inner = inner
        self.codec: Codec = inner.codec
        self.rank: int = inner.rank
        self.routed = inner.routed
        self._ready: deque[TransportEvent] = deque()
        self._async = False
        self._wake: anyio.Event | None = None
        self._ended = False

    # -- lifetime -----------------------------------------------------------------------
    def open(self) -> None:
        """Open the wrapped transport (synchronous use: the plan's clock is monotonic)."""
        if not self.faults.started:
            self.faults.start(time.monotonic)
        clock = self.faults.clock
        assert clock is not None
        self._clock = clock
        self.inner.open()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.inner.close()
            self._signal()

    async def __aenter__(self) -> FaultyEngineTransport:
        self._async = True
        await self._enter(self.inner)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self._closed = True
        try:
            await self._stop_tasks()
        finally:
            await self.inner.__aexit__(exc_type, exc, tb)

    # -- faults by hand -----------------------------------------------------------------
    def partition(self) -> None:
        """Cut this rank off now until :meth:`heal`."""
        self.faults.partition(self.rank)

    def heal(self) -> None:
        self.faults.heal(self.rank)

    def _on_close_fault(self) -> None:
        self.faults.bump("closed")
        self.close()

    def _poll_schedule(self) -> None:
        """Synchronous use: apply what the schedule task would have applied."""
        if self._async:
            return
        close_at = self.faults.plan.close_at
        if close_at is not None and not self._closed and self.faults.now() >= close_at:
            self.faults.events.append((close_at, "close", -1))
            self._on_close_fault()
        self._line.release_due(self._clock())

    # -- receive --------------------------------------------------------------------------
    def _signal(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _deliver(self, event: TransportEvent) -> None:
        self._ready.append(event)
        self._signal()

    def _accept(self, event: TransportEvent) -> None:
        """Apply the receive-side faults to one event from the wrapped transport."""
        if type(event) is Received:
            env = event.envelope
            if type(env) is Reply:
                self._deliver(event)  # not something a client sends: the endpoint counts it
                return
            verdict = self.faults.decide("receive", self.rank, env)
            if verdict is _PASS:
                self._deliver(event)
                self._release_held("receive", self.rank)
                return

            def later() -> None:
                if self.faults.is_partitioned(self.rank):
                    self._lost("receive", env)
                else:
                    self._deliver(event)

            self._route("receive", self.rank, verdict, later, later)
        elif type(event) is PeerDisconnected and self.faults.is_partitioned(self.rank):
            self.faults.bump("disconnects_suppressed")
        else:
            self._deliver(event)

    async def _pump(self) -> None:
        while True:
            try:
                event = await self.inner.receive()
            except TransportClosed:
                self._ended = True
                self._signal()
                return
            self._accept(event)

    def try_receive(self) -> TransportEvent | None:
        if self._closed:
            raise TransportClosed("transport is closed")
        self._poll_schedule()
        while not self._ready:
            if self._async:
                if self._ended:
                    raise TransportClosed("transport is closed")
                return None
            event = self.inner.try_receive()
            if event is None:
                return None
            self._accept(event)
        return self._ready.popleft()

    def wait_readable(self, timeout: float) -> bool:
        self._poll_schedule()
        if self._ready:
            return True
        nxt = self._line.release_due(self._clock())
        if self._ready:
            return True
        if nxt is not None:
            timeout = min(timeout, max(0.0, nxt - self._clock()))
        return self.inner.wait_readable(timeout) or bool(self._ready)

    async def receive(self) -> TransportEvent:
        while True:
            if self._ready:
                return self._ready.popleft()
            if self._closed or self._ended:
                raise TransportClosed("transport is closed")
            self._wake = anyio.Event()
            await self._wake.wait()

    # -- send -------------------------------------------------------------------------------
    def _send_later(self, route: Route, envelope: Envelope) -> None:
        if self._closed or self.faults.is_partitioned(self.rank):
            self._lost("send", envelope)
            return
        try:
            self.inner.send_nowait(route, envelope)
        except TransportError:
            self._lost("send", envelope)

    def send_nowait(self, route: Route, envelope: Envelope) -> None:
        if self._closed:
            raise TransportClosed("transport is closed")
        self._poll_schedule()
        verdict = self.faults.decide("send", self.rank, envelope)
        if verdict is _PASS:
            self.inner.send_nowait(route, envelope)
            self._release_held("send", self.rank)
            return
        self._route("send", self.rank, verdict,
                    lambda: self.inner.send_nowait(route, envelope),
                    lambda: self._send_later(route, envelope))

    def send_encoded_nowait(self, route: Route, data: bytes) -> None:
        """:meth:`send_nowait` of the envelope ``data`` encodes (faults are decided
        by what a frame carries)."""
        self.send_nowait(route, self.codec.decode(data))

    def heartbeat_routes(self) -> Iterable[Route]:
        return self.inner.heartbeat_routes()
