""":meth:`EngineEndpoint.serve`: the receive loop, the dispatcher actor that takes
requests in arrival order, and the lanes (one per async or threaded method, at most
``concurrency`` requests of a method at a time)."""

from __future__ import annotations

import threading

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ctlwire.kernel.actor import Actor
from ctlwire.kernel.engine_admission import EngineAdmission, _BadFrameReply, _Inbound
from ctlwire.kernel.engine_base import log
from ctlwire.kernel.engine_outbox import ReplyOutbox
from ctlwire.kernel.engine_registry import _NONE, MethodSpec
from ctlwire.kernel.tracing import current_trace
from ctlwire.transports.envelope import Reply, Request
from ctlwire.transports.errors import TransportClosed
from ctlwire.transports.transport import Received, Route

__all__ = ["EngineServing", "QueuedRequestBytes"]


def request_bytes(req: Request) -> int:
    """What a received request holds in memory, for :class:`QueuedRequestBytes`."""
    return 64 + len(req.payload) + len(req.method) + len(req.key)


class QueuedRequestBytes:
    """Bytes of requests a serving engine has taken from its transport and not yet
    started (queued at the dispatcher or at a method's lane), against a budget.

    The receive loop takes no further request while more than ``limit`` bytes are
    held (:meth:`wait_for_room`), so what waits in libzmq stays bounded by its
    high-water marks instead: requests a peer sends faster than they are handled
    hold at most ``limit`` plus one request of the engine's memory here, whatever
    their size (the mailboxes alone bound only their count)."""

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


class _Dispatcher(Actor["_Inbound | _BadFrameReply", None]):
    """The actor that takes requests in arrival order for :meth:`EngineEndpoint.serve`:
    sync inline handlers run here, one at a time; async and threaded ones are
    passed to their method's lane. A reply handed over as such (a bad frame's, or
    one whose client's pipe was full) is sent from here, in turn.

    :attr:`inflight` counts messages told and not yet handled: while it is 0,
    :meth:`EngineEndpoint.serve` may do a request's dispatching itself (run a
    sync handler, pass to a lane) without overtaking anything."""

    def __init__(self, endpoint: EngineServing, mailbox_size: int,
                 lanes: anyio.abc.TaskGroup) -> None:
        super().__init__(mailbox_size=mailbox_size, name=f"engine-{endpoint.rank}")
        self.endpoint = endpoint
        self.lanes_tg = lanes
        self.lanes: dict[str, MemoryObjectSendStream[_Inbound]] = {}
        self.inflight = 0

    async def told(self, message: _Inbound | _BadFrameReply) -> None:
        self.inflight += 1
        try:
            await self.tell(message)
        except BaseException:
            self.inflight -= 1
            raise

    async def handle(self, message: _Inbound | _BadFrameReply) -> None:
        try:
            endpoint = self.endpoint
            if type(message) is _BadFrameReply:
                await endpoint._send_async(message.route, message.reply)
                return
            assert isinstance(message, _Inbound)
            spec = endpoint._methods.get(message.request.method)
            if spec is None or not (spec.is_async or spec.threaded):
                await endpoint._run_async(message)
                return
            lane = self.lanes.get(spec.name)
            if lane is None:
                lane = self.lanes[spec.name] = self._open_lane(spec)
            await lane.send(message)  # waits while the lane is full (backpressure)
        finally:
            self.inflight -= 1

    def _open_lane(self, spec: MethodSpec) -> MemoryObjectSendStream[_Inbound]:
        send, recv = anyio.create_memory_object_stream[_Inbound](self.endpoint.mailbox_size)
        with recv:
            for i in range(spec.concurrency):
                self.lanes_tg.start_soon(self._lane_worker, recv.clone(),
                                         name=f"engine-{self.endpoint.rank}.{spec.name}.{i}")
        return send

    def close_lanes(self) -> None:
        for send in self.lanes.values():
            send.close()

    async def _lane_worker(self, recv: MemoryObjectReceiveStream[_Inbound]) -> None:
        endpoint = self.endpoint
        with recv:
            async for item in recv:  # workers take items in arrival order
                try:
                    await endpoint._run_async(item)
                except Exception:  # pragma: no cover - never let one request end the lane
                    endpoint.counters["internal_errors"] += 1
                    log.exception("engine %d: internal error handling %r", endpoint.rank, item)


class EngineServing(EngineAdmission, ReplyOutbox):
    """The async embedding of an endpoint (see the module docstring)."""

    queued_requests: QueuedRequestBytes

    # -- asynchronous embedding ------------------------------------------------
    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                    ) -> None:
        """Serve until cancelled or the transport closes. Opens and closes the
        transport; runs heartbeats in a task of its own, so a long async
        handler does not make the engine look dead. Async and threaded
        handlers run in one lane per method (see the module docstring's
        ordering guarantee), so a long or hung handler delays only requests
        of its own method."""
        async with self.transport, anyio.create_task_group() as lanes:
            dispatcher = _Dispatcher(self, self.mailbox_size, lanes)
            async with dispatcher:
                await self._serve_loop(dispatcher, lanes, task_status)

    async def _serve_loop(self, dispatcher: _Dispatcher, lanes: anyio.abc.TaskGroup,
                          task_status: anyio.abc.TaskStatus[None]) -> None:
        self._polling = False
        self._io_thread = threading.get_ident()
        self._set_ok_reply()  # rank and incarnation are fixed from here on
        self._start_beacon()
        if not self.beacon_active:
            self.send_heartbeat()
        async with anyio.create_task_group() as tg:
            if self.heartbeat_interval:
                tg.start_soon(self._heartbeat_loop)
            task_status.started()
            try:
                while True:
                    try:
                        event = await self.transport.receive()
                    except TransportClosed:
                        break
                    try:
                        if type(event) is Received and type(event.envelope) is Request:
                            req = event.envelope
                            now = self._accept(req, event.route)
                            if now is None:
                                continue
                            if not dispatcher.inflight and self._dispatch_now(
                                    dispatcher, req, event.route, now):
                                queued = self.queued_requests  # a lane may have taken it
                                if queued.held > queued.limit:
                                    await queued.wait_for_room()
                                continue
                            work: _Inbound | _BadFrameReply | None = _Inbound(
                                req, event.route, now)
                        else:
                            work = self._classify(event)
                    except Exception:  # pragma: no cover
                        self.counters["internal_errors"] += 1
                        log.exception("engine %d: cannot classify %r", self.rank, event)
                        continue
                    if work is None:
                        continue
                    if isinstance(work, _BadFrameReply):
                        await self._send_async(work.route, work.reply)
                        continue
                    queued = self.queued_requests
                    queued.add(work.request)  # released when _run_async takes it
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

    def _dispatch_now(self, dispatcher: _Dispatcher, req: Request, route: Route,
                      now: float) -> bool:
        """With nothing queued at the dispatcher, do its work for ``req`` here
        (the same order, without the hop through its mailbox): run a sync
        handler on the fast path and send the reply, or pass the request to its
        method's open lane when that has room. False, having changed nothing,
        when the dispatcher has to take it. A reply that finds the client's pipe
        full is handed to the dispatcher, which waits for room (bounded, see
        :meth:`_send_async`)."""
        out = self._run_fast(req, route, now)
        if out is not None:
            if type(out) is bytes:
                if not self._send_now(route, None, out):
                    self._hand_reply(dispatcher, route, self._reply_of(out))
                return True
            assert isinstance(out, Reply)
            reply, data = self._fit_encoded(out)
            if not self._send_now(route, reply, data):
                self._hand_reply(dispatcher, route, reply)
            return True
        spec = self._methods.get(req.method)
        if spec is None or not (spec.is_async or spec.threaded):
            return False
        lane = dispatcher.lanes.get(spec.name)
        if lane is None:
            return False
        self.queued_requests.add(req)  # released when _run_async takes it
        try:
            lane.send_nowait(_Inbound(req, route, now))
        except anyio.WouldBlock:
            self.queued_requests.release(req)
            return False
        return True

    @staticmethod
    def _hand_reply(dispatcher: _Dispatcher, route: Route, reply: Reply) -> None:
        """A reply whose client's pipe is full: the dispatcher sends it, in turn."""
        dispatcher.inflight += 1
        try:
            dispatcher.tell_nowait(_BadFrameReply(route, reply))
        except BaseException:
            dispatcher.inflight -= 1
            raise

    async def _heartbeat_loop(self) -> None:
        interval = self.heartbeat_interval
        assert interval
        while True:
            await anyio.sleep(interval)
            self.loop_came_round()
            if not self.beacon_active:
                self.send_heartbeat()
            self.send_progress_heartbeats()

    async def _run_async(self, item: _Inbound) -> None:
        # it leaves the queue: :attr:`queued_requests` counts waiting requests (those
        # running are bounded by each method's concurrency)
        self.queued_requests.release(item.request)
        admitted = self._admit(item)
        if isinstance(admitted, Reply):
            await self._send_async(item.route, admitted)
            return
        spec, payload = admitted
        args = (payload,) if spec.takes_payload and payload is not _NONE else ()
        current_trace.set(item.request.trace)  # this task handles one request at a time
        running = self._begin(item.request, item.route)
        done: Reply | None = None
        try:
            try:
                if spec.is_async:
                    result = await spec.handler(*args)
                elif spec.threaded:
                    result = await anyio.to_thread.run_sync(spec.handler, *args)
                else:
                    result = spec.handler(*args)
            except Exception as exc:
                reply = done = self._exception_reply(item, exc)
            else:
                reply = done = self._result_reply(item, result)
        finally:
            self._end(item.request, item.route, done, running)
        await self._send_async(item.route, reply)
