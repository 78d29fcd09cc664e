"""An engine served by an event loop (:meth:`EngineEndpoint.serve`): the receive
loop, the lanes requests wait in before they start (one per async or threaded
method, at most ``concurrency`` of its requests running at a time), and the task
that sends replies that waited for room.

Guarantees:

* **The receive loop never waits** on a lane, a budget or a client. A request
  is validated as it arrives (:meth:`InboundCore.check`: method, deadline,
  fence, key, payload) and answered at once when refused. A valid one for a
  sync handler, or a ``control`` one (the ledger's take-over and abort, which
  never block), runs at once, on the loop, one at a time, in arrival order; one
  for another async or threaded handler waits in its method's lane -- unless that
  lane is full, its connection's share is, or the byte budget of waiting
  requests is: then it is refused ``Busy`` (429, counted ``busy``), did not
  run, and a retry later is safe. Control never waits behind data: no lane,
  byte budget or share can refuse a take-over or an abort. So a busy method, or
  a peer flooding one, delays no other method, no read-only call or built-in,
  and no other connection's requests of other methods.
* **Bounded.** Requests taken and not started: at most ``mailbox_size`` per
  lane, ``max_queued_per_route`` per connection (all lanes together), a quarter
  of ``max_queued_request_bytes`` per connection and all of it in all, or one
  request (:class:`QueuedRequests`), counting every byte received for each.
  Replies that wait for room: the outbox's bounds, per route and in all
  (:class:`~ctlwire.kernel.engine.outbox.ReplyOutbox`); neither the receive
  loop nor a lane waits for a client to read.
* **Ordering.** Per method, requests start in arrival order, at most its
  ``concurrency`` at a time. A request's idempotency key is taken as it
  arrives: a repeat while the first waits or runs is answered ``InProgress``
  (425) at once. A request that waited in a lane is checked again as it starts
  (:meth:`InboundCore.start`: its deadline, a fence accepted meanwhile); refused
  then, or ``Busy``, it forgets its key. A route's replies leave in the order
  they were sent.
* **The loop outlives its errors.** An unexpected exception while receiving,
  dispatching or replying is counted (``internal_errors``), logged
  (rate-limited) and the next request served.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable

import anyio
import anyio.abc
import anyio.lowlevel
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ctlwire.kernel.core.inbound_core import BadFrame, InboundCore, InboundRequest, MethodSpec
from ctlwire.kernel.engine.handler_runner import HandlerRunner
from ctlwire.kernel.engine.liveness import EngineLiveness
from ctlwire.kernel.engine.outbox import ReplyOutbox
from ctlwire.transports.envelope import Reply
from ctlwire.transports.errors import TransportClosed
from ctlwire.transports.transport import EngineTransport, Route

__all__ = ["EngineServer", "QueuedRequests"]

#: what a queued request's objects hold beyond its bytes (the request, its lane entry)
_OBJECT_BYTES = 512


def request_bytes(item: InboundRequest) -> int:
    """What a received request holds in memory, for :class:`QueuedRequests`: the
    whole frame it came in (its undecoded payload keeps that frame alive), the
    strings decoded out of it, and its objects."""
    req = item.request
    held = _OBJECT_BYTES + item.size + len(req.method) + len(req.key)
    trace = req.trace
    if trace:
        held += sum(len(k) + len(v) for k, v in trace.items())
    return held


class QueuedRequests:
    """Requests taken from the transport and not yet started, against three
    budgets: ``limit`` bytes in all (or one request, however large, when none
    waits), ``per_route`` requests per route, and ``per_route_bytes`` bytes per
    route (default a quarter of ``limit``; or one request when the route has none
    waiting). Bytes are what :func:`request_bytes` charges: every byte received
    for the request. :meth:`add` refuses one beyond any budget (its sender is
    answered ``Busy``); nothing waits for room."""

    def __init__(self, limit: int, per_route: int, per_route_bytes: int | None = None) -> None:
        if limit < 0 or per_route < 1:
            raise ValueError("the byte budget must be >= 0 and per_route >= 1")
        self.limit = limit
        self.per_route = per_route
        self.per_route_bytes = limit // 4 if per_route_bytes is None else per_route_bytes
        if self.per_route_bytes < 0:
            raise ValueError("per_route_bytes must be >= 0")
        self.held = 0
        self.peak = 0
        #: route -> [its requests waiting, their bytes] (routes with none are forgotten)
        self.routes: dict[Hashable, list[int]] = {}

    @property
    def count(self) -> int:
        """Requests waiting."""
        return sum(waiting for waiting, _ in self.routes.values())

    def add(self, item: InboundRequest) -> str:
        """Count ``item`` as waiting: ``""``, or why it does not fit (nothing counted)."""
        size = request_bytes(item)
        held = self.held + size
        if held > self.limit and self.held:
            return f"requests waiting to start hold {self.held} bytes of {self.limit}"
        route = item.route
        share = self.routes.get(route)
        if share is not None:
            waiting, route_bytes = share
            if waiting >= self.per_route:
                return f"this connection has {waiting} requests waiting to start"
            if route_bytes + size > self.per_route_bytes:
                return (f"this connection's requests waiting to start hold {route_bytes} "
                        f"bytes of its {self.per_route_bytes}")
            share[0] = waiting + 1
            share[1] = route_bytes + size
        else:
            self.routes[route] = [1, size]
        self.held = held
        if held > self.peak:
            self.peak = held
        return ""

    def release(self, item: InboundRequest) -> None:
        """``item`` (counted by :meth:`add`) starts, or will not."""
        size = request_bytes(item)
        self.held -= size
        share = self.routes[item.route]
        if share[0] > 1:
            share[0] -= 1
            share[1] -= size
        else:
            del self.routes[item.route]


_FLUSH_MIN = 0.001
_FLUSH_MAX = 0.005  # the longest a reply waits after its client's pipe has room


class EngineServer:
    """Serves one endpoint's parts on an event loop; see the module docstring."""

    def __init__(self, transport: EngineTransport, core: InboundCore, outbox: ReplyOutbox,
                 liveness: EngineLiveness, runner: HandlerRunner, queued: QueuedRequests,
                 *, mailbox_size: int, internal_error: Callable[[str], None]) -> None:
        self.transport = transport
        self.core = core
        self.outbox = outbox
        self.liveness = liveness
        self.runner = runner
        self.queued = queued
        self.mailbox_size = mailbox_size
        #: method name -> its lane (async and threaded methods, opened on first use)
        self.lanes: dict[str, MemoryObjectSendStream[InboundRequest]] = {}
        self._lanes_tg: anyio.abc.TaskGroup | None = None
        self._replies_wait: anyio.Event | None = None  # set: the flusher has work
        #: an unexpected exception while doing what it names: counted and logged
        self.internal_error = internal_error

    async def serve(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with self.transport, anyio.create_task_group() as lanes:
            self._lanes_tg = lanes
            try:
                await self._serve_loop(task_status)
            finally:
                lanes.cancel_scope.cancel()
                for send in self.lanes.values():
                    send.close()

    async def _serve_loop(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        live, core = self.liveness, self.core
        live.polling = False
        live.io_thread = threading.get_ident()
        live.start_beacon()
        if not live.beacon_active:
            live.send_heartbeat()
        receive, take, reply = self.transport.receive, self._take, self.reply
        async with anyio.create_task_group() as tg:
            if live.heartbeat_interval:
                tg.start_soon(self._heartbeat_loop)
            tg.start_soon(self._flush_loop)
            task_status.started()
            try:
                while True:
                    try:
                        event = await receive()
                    except TransportClosed:
                        break
                    except Exception:
                        self.internal_error("receiving")
                        await anyio.lowlevel.checkpoint()  # a transport that keeps failing
                        continue
                    try:
                        work = core.receive(event)
                        if type(work) is InboundRequest:
                            take(work)
                        elif type(work) is BadFrame:
                            reply(work.route, work.reply)
                    except Exception:  # never let one frame end the loop
                        self.internal_error(f"handling {event!r:.200}")
            finally:
                tg.cancel_scope.cancel()

    def _take(self, item: InboundRequest) -> None:
        """Run, queue or refuse a request as it arrives; never waits."""
        core = self.core
        spec = core.methods.get(item.request.method)
        if spec is not None and (spec.is_async or spec.threaded) and not spec.control:
            refused = core.check(item, item.received)
            if refused is None:
                lane = self.lanes.get(spec.name)
                if lane is None:
                    lane = self._open_lane(spec)
                refused = self._queue(item, lane)
            if refused is not None:
                self.reply(item.route, refused)
            return
        reply = core.admit(item, item.received)
        if reply is None:
            reply = self.runner.run_sync(item)
        self.reply(item.route, reply)

    def _queue(self, item: InboundRequest, lane: MemoryObjectSendStream[InboundRequest]
               ) -> Reply | None:
        """Queue a checked request in ``lane``: None, or its ``Busy`` refusal."""
        why = self.queued.add(item)
        if why:
            return self.core.busy(item, why)
        try:
            lane.send_nowait(item)
        except anyio.WouldBlock:
            self.queued.release(item)
            return self.core.busy(item, f"{self.mailbox_size} requests of "
                                  f"{item.request.method!r} wait to start")
        return None

    def reply(self, route: Route, reply: Reply) -> None:
        """Send ``reply`` now, or leave it in the outbox for the flusher."""
        outbox = self.outbox
        outbox.send(route, reply)
        if outbox.queues and self._replies_wait is not None:
            self._replies_wait.set()

    async def _flush_loop(self) -> None:
        """Send the replies that wait for room, each route as soon as it has some
        (polled, backing off to 5 ms); mark stalled a route that takes none for
        ``reply_send_timeout``."""
        outbox = self.outbox
        pause = _FLUSH_MIN
        while True:
            if not outbox.queues:
                self._replies_wait = wait = anyio.Event()
                await wait.wait()
                self._replies_wait = None
                pause = _FLUSH_MIN
            await anyio.sleep(pause)
            waiting = outbox.replies
            try:
                outbox.flush()
                outbox.expire()
            except Exception:
                self.internal_error("sending replies")
            pause = _FLUSH_MIN if outbox.replies < waiting else min(pause * 2, _FLUSH_MAX)

    def _open_lane(self, spec: MethodSpec) -> MemoryObjectSendStream[InboundRequest]:
        assert self._lanes_tg is not None
        send, recv = anyio.create_memory_object_stream[InboundRequest](self.mailbox_size)
        with recv:
            for i in range(spec.concurrency):
                self._lanes_tg.start_soon(self._lane_worker, recv.clone(),
                                          name=f"engine-{self.core.rank}.{spec.name}.{i}")
        self.lanes[spec.name] = send
        return send

    async def _lane_worker(self, recv: MemoryObjectReceiveStream[InboundRequest]) -> None:
        with recv:
            async for item in recv:  # workers take items in arrival order
                try:
                    await self.run(item)
                except Exception:  # never let one request end the lane
                    self.internal_error(f"handling {item.request!r:.200}")
                    self.core.cancelled(item)  # no outcome: its key is forgotten

    async def run(self, item: InboundRequest) -> None:
        """Start a request that waited (checked again), run its handler, send its reply."""
        self.queued.release(item)
        reply = self.core.start(item)
        if reply is None:
            reply = await self.runner.run_async(item)
        self.reply(item.route, reply)

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
