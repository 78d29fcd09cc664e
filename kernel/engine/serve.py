"""An engine served by an event loop (:meth:`EngineEndpoint.serve`): the receive
loop, the dispatcher that takes requests in arrival order, and the lanes (one per
async or threaded method, at most ``concurrency`` requests of a method at a time).

Guarantees: requests are admitted through the inbound core in arrival order per
method; a sync inline handler runs on the loop, one at a time; a full lane or a
busy dispatcher holds requests back (backpressure), and requests taken and not
started hold at most ``max_queued_request_bytes`` plus one request
(:class:`QueuedRequestBytes`). A request's deadline is checked when it starts.
"""

from __future__ import annotations

import logging
import threading

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ctlwire.kernel.actor import Actor
from ctlwire.kernel.core.inbound_core import BadFrame, InboundCore, InboundRequest
from ctlwire.kernel.engine.handler_runner import HandlerRunner
from ctlwire.kernel.engine.liveness import EngineLiveness
from ctlwire.kernel.engine.outbox import ReplyOutbox
from ctlwire.transports.envelope import Request
from ctlwire.transports.errors import TransportClosed
from ctlwire.transports.transport import EngineTransport

__all__ = ["EngineServer", "QueuedRequestBytes"]

log = logging.getLogger("ctlwire.engine")


def request_bytes(req: Request) -> int:
    """What a received request holds in memory, for :class:`QueuedRequestBytes`."""
    return 64 + len(req.payload) + len(req.method) + len(req.key)


class QueuedRequestBytes:
    """Bytes of requests taken from the transport and not yet started, against a
    budget: the receive loop takes no further request while more than ``limit``
    are held (:meth:`wait_for_room`), so the rest waits in libzmq, bounded by its
    high-water marks."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0
        self._room: anyio.Event | None = None

    def add(self, req: Request) -> None:
        self.held += request_bytes(req)
        if self.held > self.peak:
            self.peak = self.held

    def release(self, req: Request) -> None:
        self.held -= request_bytes(req)
        room = self._room
        if room is not None and self.held <= self.limit:
            self._room = None
            room.set()

    async def wait_for_room(self) -> None:
        """Return once at most ``limit`` bytes are held."""
        while self.held > self.limit:
            if self._room is None:
                self._room = anyio.Event()
            await self._room.wait()


Work = InboundRequest | BadFrame


class EngineServer:
    """Serves one endpoint's parts on an event loop; see the module docstring."""

    def __init__(self, transport: EngineTransport, core: InboundCore, outbox: ReplyOutbox,
                 liveness: EngineLiveness, runner: HandlerRunner, queued: QueuedRequestBytes,
                 *, mailbox_size: int) -> None:
        self.transport = transport
        self.core = core
        self.outbox = outbox
        self.liveness = liveness
        self.runner = runner
        self.queued = queued
        self.mailbox_size = mailbox_size

    async def serve(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with self.transport, anyio.create_task_group() as lanes:
            dispatcher = _Dispatcher(self, lanes)
            async with dispatcher:
                await self._serve_loop(dispatcher, lanes, task_status)

    async def _serve_loop(self, dispatcher: _Dispatcher, lanes: anyio.abc.TaskGroup,
                          task_status: anyio.abc.TaskStatus[None]) -> None:
        live, core, queued = self.liveness, self.core, self.queued
        live.polling = False
        live.io_thread = threading.get_ident()
        live.start_beacon()
        if not live.beacon_active:
            live.send_heartbeat()
        async with anyio.create_task_group() as tg:
            if live.heartbeat_interval:
                tg.start_soon(self._heartbeat_loop)
            task_status.started()
            try:
                while True:
                    try:
                        event = await self.transport.receive()
                    except TransportClosed:
                        break
                    try:
                        work = core.receive(event)
                        if work is None:
                            continue
                        if type(work) is BadFrame:
                            await self.outbox.send_async(work.route, work.reply)
                            continue
                        assert type(work) is InboundRequest
                        if not dispatcher.inflight and self._dispatch_now(dispatcher, work):
                            if queued.held > queued.limit:  # a lane may have taken it
                                await queued.wait_for_room()
                            continue
                    except Exception:  # pragma: no cover - never let one frame end the loop
                        core.counters["internal_errors"] += 1
                        log.exception("engine %d: cannot handle %r", core.rank, event)
                        continue
                    queued.add(work.request)  # released when the request starts
                    try:
                        await dispatcher.told(work)
                    except BaseException:
                        queued.release(work.request)
                        raise
                    if queued.held > queued.limit:
                        await queued.wait_for_room()
            finally:
                tg.cancel_scope.cancel()
                lanes.cancel_scope.cancel()
                dispatcher.close_lanes()

    def _dispatch_now(self, dispatcher: _Dispatcher, item: InboundRequest) -> bool:
        """With nothing queued at the dispatcher, do its work for ``item`` here (the
        same order, without the hop through its mailbox): admit and run a sync
        inline handler, or pass to its method's open lane when that has room.
        False, having changed nothing, when the dispatcher has to take it."""
        spec = self.core.methods.get(item.request.method)
        if spec is not None and (spec.is_async or spec.threaded):
            lane = dispatcher.lanes.get(spec.name)
            if lane is None:
                return False
            self.queued.add(item.request)  # released when the request starts
            try:
                lane.send_nowait(item)
            except anyio.WouldBlock:
                self.queued.release(item.request)
                return False
            return True
        reply = self.core.admit(item, item.received)
        if reply is None:
            reply = self.runner.run_sync(item)
        if not self.outbox.send_now(item.route, reply):
            dispatcher.inflight += 1  # the dispatcher waits for room, in turn
            try:
                dispatcher.tell_nowait(BadFrame(item.route, reply))
            except BaseException:
                dispatcher.inflight -= 1
                raise
        return True

    async def _heartbeat_loop(self) -> None:
        live = self.liveness
        interval = live.heartbeat_interval
        assert interval
        while True:
            await anyio.sleep(interval)
            live.loop_came_round()
            if not live.beacon_active:
                live.send_heartbeat()
            live.send_progress_heartbeats()

    async def run(self, item: InboundRequest) -> None:
        """Admit ``item`` as it starts, run its handler, send its reply."""
        self.queued.release(item.request)
        reply = self.core.admit(item)
        if reply is None:
            reply = await self.runner.run_async(item)
        await self.outbox.send_async(item.route, reply)


class _Dispatcher(Actor[Work, None]):
    """Takes requests in arrival order: sync inline handlers run here, one at a
    time; async and threaded ones go to their method's lane. A reply handed over
    as a :class:`BadFrame` (one whose client's pipe was full) is sent from here.
    :attr:`inflight` counts messages told and not yet handled."""

    def __init__(self, server: EngineServer, lanes: anyio.abc.TaskGroup) -> None:
        super().__init__(mailbox_size=server.mailbox_size, name=f"engine-{server.core.rank}")
        self.server = server
        self.lanes_tg = lanes
        self.lanes: dict[str, MemoryObjectSendStream[InboundRequest]] = {}
        self.inflight = 0

    async def told(self, message: Work) -> None:
        self.inflight += 1
        try:
            await self.tell(message)
        except BaseException:
            self.inflight -= 1
            raise

    async def handle(self, message: Work) -> None:
        try:
            server = self.server
            if type(message) is BadFrame:
                await server.outbox.send_async(message.route, message.reply)
                return
            assert type(message) is InboundRequest
            spec = server.core.methods.get(message.request.method)
            if spec is None or not (spec.is_async or spec.threaded):
                await server.run(message)
                return
            lane = self.lanes.get(spec.name)
            if lane is None:
                lane = self.lanes[spec.name] = self._open_lane(spec.name, spec.concurrency)
            await lane.send(message)  # waits while the lane is full (backpressure)
        finally:
            self.inflight -= 1

    def _open_lane(self, name: str, concurrency: int
                   ) -> MemoryObjectSendStream[InboundRequest]:
        send, recv = anyio.create_memory_object_stream[InboundRequest](self.server.mailbox_size)
        with recv:
            for i in range(concurrency):
                self.lanes_tg.start_soon(self._lane_worker, recv.clone(),
                                         name=f"engine-{self.server.core.rank}.{name}.{i}")
        return send

    def close_lanes(self) -> None:
        for send in self.lanes.values():
            send.close()

    async def _lane_worker(self, recv: MemoryObjectReceiveStream[InboundRequest]) -> None:
        server = self.server
        with recv:
            async for item in recv:  # workers take items in arrival order
                try:
                    await server.run(item)
                except Exception:  # pragma: no cover - never let one request end the lane
                    server.core.counters["internal_errors"] += 1
                    log.exception("engine %d: internal error handling %r", server.core.rank,
                                  item)
