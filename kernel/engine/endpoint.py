"""The engine side: an allow-list of control methods, served over an EngineTransport.

::

    endpoint = EngineEndpoint(transport, rank=0)

    @endpoint.method()
    def update_weights(req: UpdateWeights) -> int:   # payload validated as UpdateWeights
        ...

    await endpoint.serve()        # an async engine, or:
    endpoint.poll()               # between steps of a synchronous busy loop

Guarantees:

* **Allow-list dispatch.** Only registered methods run; a request for any other
  name is Rejected with ``UnknownMethod``. Nothing is looked up by ``getattr``.
* **Validated payloads.** A handler's payload is decoded as the type its
  parameter declares (msgspec); a mismatch is Rejected with ``InvalidPayload``
  and the handler never sees it.
* **Deadlines.** A request whose deadline has already passed is Expired with
  ``DeadlineExpired`` and not run.
* **Ordering.** Every request moves through the ``InboundRequest`` table
  (Received → Running → Replied, or Rejected / Expired) and gets exactly one
  reply; a handler that raises gets an error reply carrying its class name,
  message and ``code`` attribute. With :meth:`poll` (sync handlers) requests
  run one at a time in arrival order, and nothing is received while one runs.
  With :meth:`serve`, requests are taken in arrival order; async and
  ``threaded`` handlers run in a lane per method: **per method, requests start
  in arrival order, at most ``concurrency`` at a time (default 1, so each
  method stays serial)**, and the lanes of different methods run concurrently
  while the engine keeps receiving — ``get_server_info`` is answered while a
  long async ``update_weights`` runs, and a hung lane handler blocks only its
  own method. A plain sync handler runs on the event loop as it arrives, one
  at a time: while it runs the engine receives nothing (no ``InProgress``, no
  ``Busy``, no read-only built-in answered, no other method started) and
  nothing else on the loop runs. Across methods there is no ordering; read-only sync handlers
  (and the built-ins) run as they arrive. A request that waits is validated as it
  arrives and checked again (deadline, fence, key) when it starts.
  :attr:`EngineEndpoint.running` maps each request id being handled to its
  method and start time (``time.monotonic``).
* **Busy, not deaf.** Under :meth:`serve` the engine never stops receiving
  because requests wait: a request that finds its method's lane full
  (``mailbox_size`` waiting), its connection's share full
  (``max_queued_per_route`` waiting, all methods together) or the waiting
  requests' byte budget full (``max_queued_request_bytes``) is refused at once
  with ``Busy`` (429, counted ``busy``; it did not run, a retry later is safe),
  so one busy method, or one flooding peer, never delays another method or a
  read-only call (:mod:`~ctlwire.kernel.engine.serve`).
* **At most once.** A request id already seen on the same route (a
  duplicated frame) is dropped and counted, never run twice. Ids are
  remembered per route (the connection a frame came from, not the client id
  it claims), so no other connection can make a legitimate request look like
  a duplicate (:class:`~ctlwire.kernel.core.duplicate_filter.DuplicateFilter`).
* **Bad input is answered or counted, never fatal.** Malformed and oversized
  frames are answered with a typed error when their id can be read, else
  counted; nothing in the receive path can end the endpoint.
* **Liveness that does not depend on the handler's thread.** Heartbeats go
  out every ``heartbeat_interval`` from the transport's liveness beacon (a
  thread and socket of its own, :mod:`ctlwire.transports.zmq_beacon`), so a
  sync handler or step may block for minutes and the rank stays alive; other
  transports get in-band heartbeats from :meth:`serve` or :meth:`poll`. Each
  heartbeat says what is running, for how long, and what the handler reported
  with :func:`report_progress`; a step that keeps :meth:`poll` from being
  called for more than an interval is reported as method ``"(step)"``
  (:mod:`~ctlwire.kernel.engine.liveness`).
* **Idempotency keys.** A request with a key (``Request.key``) whose
  ``(route, method, key)`` already ran is answered with the first run's
  outcome, result or error (:class:`~ctlwire.kernel.core.result_cache.ResultCache`);
  the handler runs once. A key longer than the cache's ``max_key_bytes`` is
  refused with ``KeyTooLong`` (414); a new key that does not fit the cache's
  byte budget without evicting an entry inside its retry window is refused
  with ``CacheFull`` (507) and not run; each connection may hold only its
  share of the cache, so one peer cannot fill it
  for the others; a request refused by the engine or by its handler
  (:class:`~ctlwire.kernel.core.inbound_core.Refused`) holds no key. Keys are
  scoped by connection: on a transport with routes (a ROUTER engine) by the
  route, never by the ``client`` field a request carries, so no other
  connection can read or pre-empt them (a client whose connection was
  re-established has a new route, and a retry over it runs again); on a
  transport without routes (a DEALER, PULL or PAIR engine, serving the one
  client it is paired with) the request's ``client`` field names that client.
* **Fencing.** A fencing token is microseconds since the epoch. A request
  whose token is lower than the highest this engine has accepted is refused
  with ``Fenced`` (409); one that is negative or more than ``fence_window``
  seconds ahead of the engine's clock with ``FenceOutOfRange`` (416); neither
  runs. Only a fully validated request of a state-changing method moves the
  fence (:class:`~ctlwire.kernel.core.fencing.FenceGuard`).
* **Read-only methods** (``read_only=True``, and the built-in
  ``ctlwire.metrics``) ignore fences and idempotency keys.
* **Heartbeats that reach every peer name no request** (a ROUTER engine's
  PUB beacon): the id and progress of a running request go only to the route
  that sent it.
* **A client that does not read cannot stall the others.** Replies that find
  their client's pipe full wait in a queue of that client's route only,
  bounded per route (``max_unread_replies``, ``max_unread_bytes``) and in
  total (``max_outbox_bytes``); beyond, a reply is dropped and counted
  (``replies_dropped_unread``). :meth:`poll` flushes every route's queue, at
  its start and after its batch, without letting a full one hold up the rest;
  a poll loop waits at most 5 ms for input while replies wait
  (:meth:`idle_wait`). Under :meth:`serve` a reply
  waits at most ``reply_send_timeout`` for room; a route that timed out is
  marked stalled and further replies to it are dropped at once (counted)
  until it takes one again, so the dispatcher keeps serving other clients.
* **What peers send is bounded in bytes.** Under :meth:`serve`, requests taken
  and not yet started hold at most ``max_queued_request_bytes`` (or one
  request): beyond, a request is refused ``Busy``; what is not yet received
  waits in libzmq, whose high-water marks are sized in bytes (see
  :class:`~ctlwire.transports.zmq_config.ZmqOptions`).
* **Another peer's request ids are nobody's business.** ``ctlwire.metrics``
  lists the ids of running requests only to the route that sent them (it counts
  the others); an operation step is owned by its connection: on a ROUTER
  engine its route, never the ``client`` field a request carries (a number a
  peer could read); a DEALER, PULL or PAIR engine serves one client, which the
  ``client`` field names (:mod:`~ctlwire.kernel.engine.operation_ledger`).
* **The engine's own guards never end it.** An unexpected exception while
  receiving, dispatching, sending a reply or a heartbeat is counted
  (``internal_errors``, ``heartbeat_failures``) and logged, and the next request
  is served, in :meth:`poll`, :meth:`serve` and a
  :class:`~ctlwire.kernel.engine.busy_loop.BusyLoop`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc

from ctlwire.kernel.core.duplicate_filter import DuplicateFilter
from ctlwire.kernel.core.fencing import DEFAULT_FENCE_WINDOW, FenceGuard
from ctlwire.kernel.core.inbound_core import BadFrame, InboundCore, InboundRequest, MethodSpec
from ctlwire.kernel.core.result_cache import ResultCache
from ctlwire.kernel.engine.builtin_methods import ENGINE_METRICS_METHOD
from ctlwire.kernel.engine.engine_snapshot import engine_snapshot
from ctlwire.kernel.engine.handler_runner import HandlerRunner
from ctlwire.kernel.engine.liveness import (
    STEP_METHOD,
    EngineLiveness,
    new_incarnation,
    report_progress,
)
from ctlwire.kernel.engine.method_table import NO_PAYLOAD, MethodTable
from ctlwire.kernel.engine.outbox import ReplyOutbox
from ctlwire.kernel.engine.serve import EngineServer, QueuedRequests
from ctlwire.states import InboundState
from ctlwire.transports.envelope import Heartbeat, Request
from ctlwire.transports.error_codes import ErrorCode
from ctlwire.transports.errors import TransportClosed
from ctlwire.transports.transport import EngineTransport, Received

__all__ = ["STEP_METHOD", "EngineEndpoint", "ErrorCode", "MethodSpec", "new_incarnation",
           "report_progress"]

#: the longest a poll loop waits for input while replies wait for room
_OUTBOX_RETRY = 0.005


class EngineEndpoint:
    """Serves registered control methods for one engine rank, with the guarantees above.

    Composed of parts it owns, each built and tested alone: :attr:`method_table`
    (the allow-list), :attr:`core` (every admission decision and state
    transition), :attr:`runner` (where a handler runs), :attr:`outbox` (replies
    out, bounded) and :attr:`liveness` (what is running, heartbeats)."""

    def __init__(
        self,
        transport: EngineTransport,
        *,
        rank: int | None = None,
        incarnation: int | None = None,
        heartbeat_interval: float | None = 0.25,
        mailbox_size: int = 256,
        dedup_window: int = 4096,
        dedup_peers: int = 64,
        fence_window: float = DEFAULT_FENCE_WINDOW,
        clock: Callable[[], float] = time.time,
        beacon: bool = True,
        result_cache: ResultCache | None = None,
        max_unread_replies: int = 1024,
        max_unread_bytes: int = 4 << 20,
        max_outbox_bytes: int = 32 << 20,
        reply_send_timeout: float = 1.0,
        max_queued_request_bytes: int = 64 << 20,
        max_queued_per_route: int = 64,
    ) -> None:
        self.transport = transport
        self.codec = transport.codec
        self.rank = transport.rank if rank is None else rank
        self.incarnation = incarnation or new_incarnation()
        self.heartbeat_interval = heartbeat_interval
        self.mailbox_size = mailbox_size
        self.clock = clock
        self.method_table = MethodTable(self.codec)
        self.core = InboundCore(self.method_table.specs, self.codec, rank=self.rank,
                                incarnation=self.incarnation, clock=clock,
                                duplicates=DuplicateFilter(dedup_window, dedup_peers),
                                fences=FenceGuard(fence_window), results=result_cache,
                                key_of=transport.peer_key)
        self.liveness = EngineLiveness(transport, rank=self.rank, incarnation=self.incarnation,
                                       heartbeat_interval=heartbeat_interval, beacon=beacon,
                                       peer_of=self.core.peer)
        self.runner = HandlerRunner(self.core, self.liveness)
        self.outbox = ReplyOutbox(transport, max_unread_replies=max_unread_replies,
                                  max_unread_bytes=max_unread_bytes,
                                  max_outbox_bytes=max_outbox_bytes,
                                  reply_send_timeout=reply_send_timeout)
        #: serve mode: requests taken and not started, against their budgets
        self.queued_requests = QueuedRequests(max_queued_request_bytes, max_queued_per_route)
        self._opened = False
        self._closed = False
        # poll(): the next event, waiting up to a timeout when one is given (None: none)
        self._take_one = transport.receive_one
        # built in, read-only, allow-listed like any method: what metrics() returns
        self.register(ENGINE_METRICS_METHOD, self.metrics, payload_type=None, read_only=True)
        self.method_table.builtin = frozenset(self.method_table.specs)

    # -- the method table ----------------------------------------------------------
    def register(self, name: str, handler: Callable[..., Any], *, payload_type: Any = NO_PAYLOAD,
                 threaded: bool = False, concurrency: int = 1, read_only: bool = False,
                 control: bool = False, _caller_frame: int = 1) -> MethodSpec:
        """Allow ``name``, served by ``handler``
        (:meth:`~ctlwire.kernel.engine.method_table.MethodTable.register`)."""
        return self.method_table.register(
            name, handler, payload_type=payload_type, threaded=threaded,
            concurrency=concurrency, read_only=read_only, control=control,
            _caller_frame=_caller_frame + 1)

    def method(self, name: str | None = None, *, payload_type: Any = NO_PAYLOAD,
               threaded: bool = False, concurrency: int = 1, read_only: bool = False
               ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator form of :meth:`register` (name defaults to the function's).

        Under :meth:`serve` an ``async def`` handler, or a sync one with
        ``threaded=True``, runs in its method's lane (at most ``concurrency`` at a
        time, in arrival order) while the engine keeps receiving; lanes of
        different methods run concurrently. A plain sync handler runs on the
        receive loop: while it runs the engine receives nothing (no
        ``InProgress``, no ``Busy``, no read-only built-in answered, no other
        method started) and nothing else on the loop runs -- two 1 s sync
        handlers of two methods called at once take about 2 s (as do a sync and a
        lane one), two threaded or async ones about 1 s. Make a handler that
        blocks ``threaded`` (its state then shared across threads) or async."""
        return self.method_table.method(name, payload_type=payload_type, threaded=threaded,
                                        concurrency=concurrency, read_only=read_only)

    @property
    def methods(self) -> list[str]:
        """The methods registered on this endpoint (not the built-in ones)."""
        return self.method_table.methods

    @property
    def builtin_methods(self) -> list[str]:
        """Methods every endpoint serves: ``ctlwire.metrics`` (its :meth:`metrics`)."""
        return self.method_table.builtin_methods

    # -- synchronous embedding -------------------------------------------------
    def open(self) -> None:
        """Open the transport (sync engines), start the liveness beacon where the
        transport has one, and send the first heartbeat. Idempotent;
        :meth:`poll` calls it when it was not called."""
        self.transport.open()
        if not self._opened:
            self._opened = True
            live = self.liveness
            live.polling = True
            live.io_thread = threading.get_ident()
            live.last_loop = time.monotonic()
            live.start_beacon()
            live.heartbeat_if_due(live.last_loop)

    def close(self) -> None:
        self._closed = True
        self.transport.close()

    def poll(self, max_messages: int = 64, timeout: float = 0.0) -> int:
        """Handle up to ``max_messages`` ready requests; send a heartbeat if one is
        due. Returns how many requests were handled. Sync handlers only (an
        async handler gets an error reply).

        With no ``timeout`` it never blocks. With one, when nothing is ready it
        waits up to ``timeout`` seconds (at most 5 ms while replies wait in the
        outbox) for the first event: a loop's wait and receive in one call (on
        a sync engine's own socket, one blocking receive).

        Each event is handled (its reply sent) before the next is received, so
        a lone request's reply is not delayed by asking for another. The first
        ``poll()`` opens the endpoint (:meth:`open`) if that was not done yet, so
        a loop of ``poll()`` alone serves requests; after :meth:`close` it
        raises TransportClosed instead of returning 0 for ever.
        """
        if self._closed:
            raise TransportClosed(f"engine {self.rank}: poll() after close()")
        if not self._opened:
            self.open()
        live, outbox = self.liveness, self.outbox
        live.loop_came_round(time.monotonic())
        if outbox.queues:
            outbox.flush()
            if outbox.queues and timeout > _OUTBOX_RETRY:
                timeout = _OUTBOX_RETRY
        if max_messages < 1:
            return 0
        take, core, run = self._take_one, self.core, self.runner.run_sync
        handled = taken = 0
        while taken < max_messages:
            # a receive that finds nothing returns None (the transport asks the
            # socket's EVENTS first): it raises nothing, so it is also the check for
            # a second event after a lone request; only the first may wait
            try:
                event = take(timeout) if timeout and not taken else take()
            except TransportClosed:
                if not taken:
                    return 0
                break
            except Exception:  # never let the transport end the loop: the next poll() asks again
                self._internal_error("receiving")
                if not taken:
                    if timeout:  # not at once: the wait asked for, as if nothing came
                        self._wait_quietly(timeout)
                    return 0
                break
            if event is None:
                break
            taken += 1
            try:
                # the seams a different loop builds on: core.arrive (or core.receive,
                # core.accept then core.admit) gives the Running request or the reply
                # that ends it, runner.run_sync runs its handler on this thread,
                # outbox.send sends the reply
                if type(event) is Received and type(event.envelope) is Request:
                    route = event.route
                    work = core.arrive(event.envelope, route)
                    if work is None:
                        continue  # a duplicate: dropped, counted
                    outbox.send(route, run(work) if type(work) is InboundRequest
                                else work)  # type: ignore[arg-type]
                    handled += 1
                    continue
                bad = core.receive(event)
                if type(bad) is BadFrame:
                    outbox.send(bad.route, bad.reply)
                else:
                    assert bad is None, "a request event is handled above"
            except Exception:  # never let one frame end the loop
                self._internal_error(f"handling {event!r:.200}")
        if handled:
            live.last_loop = time.monotonic()  # what ran is done: the loop came round
        if outbox.queues:  # a burst's replies that found the pipe full: room now, likely
            outbox.flush()
        return handled

    def _wait_quietly(self, timeout: float) -> None:
        """Block up to ``timeout`` s for input, whatever the transport raises."""
        try:
            self.transport.wait_readable(timeout)
        except Exception:  # it cannot wait either: not a busy loop
            time.sleep(timeout)

    def _internal_error(self, doing: str) -> None:
        """An unexpected exception while ``doing``: counted and logged (rate-limited)."""
        self.core.counters["internal_errors"] += 1
        self.outbox.unsent_log.log(logging.ERROR, "internal", "engine %d: internal error %s",
                                   self.rank, doing, exc_info=True)

    def idle_wait(self, timeout: float) -> float:
        """How long a poll loop may block waiting for input: ``timeout``, or at most
        5 ms while replies wait in the outbox for room (they go out on the next
        :meth:`poll`)."""
        return min(timeout, _OUTBOX_RETRY) if self.outbox.queues else timeout

    def run_blocking(self, stop: threading.Event | None = None, *,
                     step: Callable[[], None] | None = None, idle_wait: float | None = None
                     ) -> None:
        """A synchronous engine loop: ``step()`` (your work), then :meth:`poll`,
        blocking up to ``idle_wait`` seconds for input when there is no
        ``step``. Runs until ``stop`` is set."""
        wait = idle_wait if idle_wait is not None else (self.heartbeat_interval or 0.25) / 2
        self.open()
        try:
            while stop is None or not stop.is_set():
                if step is None:  # the wait is the receive: one request a round
                    self.poll(1, wait)
                    continue
                step()
                self.poll()
        finally:
            self.close()

    # -- asynchronous embedding ------------------------------------------------
    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                    ) -> None:
        """Serve until cancelled or the transport closes. Opens and closes the
        transport; runs heartbeats in a task of its own, so a long async
        handler does not make the engine look dead. Async and threaded
        handlers run in one lane per method (see the ordering
        guarantee above), so a long or hung one delays only requests of its
        own method; a plain sync handler runs on the loop and holds it,
        receiving included, until it returns."""
        await EngineServer(self.transport, self.core, self.outbox, self.liveness, self.runner,
                           self.queued_requests, mailbox_size=self.mailbox_size,
                           internal_error=self._internal_error).serve(task_status)

    # -- what the parts know, by their names before the parts ------------------
    @property
    def running(self) -> dict[int, tuple[str, float]]:
        """Requests being handled now: request id -> (method, ``time.monotonic()`` at start)."""
        return self.liveness.running

    def report_progress(self, request_id: int, fraction: float, note: str = "") -> bool:
        """Record the progress of running request ``request_id`` (see :func:`report_progress`)."""
        return self.liveness.report_progress(request_id, fraction, note)

    def status_heartbeat(self) -> Heartbeat | None:
        return self.liveness.status_heartbeat()

    def send_heartbeat(self) -> None:
        self.liveness.send_heartbeat()

    @property
    def heartbeats_paused(self) -> bool:
        """A hook for fault tests: while set, no heartbeat goes out (a hung process)."""
        return self.liveness.paused

    @heartbeats_paused.setter
    def heartbeats_paused(self, paused: bool) -> None:
        self.liveness.paused = paused

    @property
    def results(self) -> ResultCache:
        return self.core.results

    @property
    def fence_high(self) -> int:
        """The highest fencing token this engine has accepted (0: none)."""
        return self.core.fences.high

    @property
    def states(self) -> dict[InboundState, int]:
        return self.core.states

    @property
    def counters(self) -> dict[str, int]:
        """Every part's counters, one dict (a copy)."""
        live = self.liveness
        return {**self.core.counters, **self.outbox.counters,
                "heartbeats_sent": live.heartbeats_sent,
                "heartbeat_failures": live.heartbeat_failures}

    @property
    def outbox_bytes(self) -> int:
        """Bytes of replies waiting for room (poll mode)."""
        return self.outbox.bytes

    @property
    def outbox_replies(self) -> int:
        return self.outbox.replies

    @property
    def outbox_peak_bytes(self) -> int:
        return self.outbox.peak_bytes

    def metrics(self) -> dict[str, Any]:
        """This engine's metrics: the engine side of the one metrics shape (the
        README's metrics table; :func:`ctlwire.kernel.observability.metrics.engine_metrics` returns
        the same); also served to clients as the built-in ``ctlwire.metrics``
        method (``await client.engine_metrics(rank)``)."""
        return engine_snapshot(self)
