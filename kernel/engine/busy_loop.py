"""A synchronous busy loop as an engine: its socket owned by an I/O thread, read-only
methods answered while the loop steps or runs a long method.

::

    endpoint = EngineEndpoint(transport, rank=0)
    loop = BusyLoop(endpoint)            # before any method is registered

    @endpoint.method(read_only=True)
    def get_server_info() -> dict:       # runs on the I/O thread, at any time
        return snapshot                  # e.g. a dict the loop replaces between steps

    @endpoint.method()
    def update_weights(req: Update) -> int:   # runs on the loop's thread, in poll()
        ...

    with loop:                           # starts the I/O thread
        loop.run_blocking(stop, step=model_step)   # or: while ...: step(); loop.poll()

Guarantees:

* **One thread owns the socket.** The endpoint serves
  (:meth:`~ctlwire.kernel.engine.endpoint.EngineEndpoint.serve`) in an event
  loop on a thread of its own (the I/O thread); the loop's thread
  never touches the transport. Everything ``serve`` guarantees holds: exactly
  one reply per request, fences and idempotency keys for state-changing
  methods, liveness from the beacon, metrics, bounded queues.
* **Read-only methods are answered while the loop is busy.** A method
  registered with ``read_only=True`` (and ``ctlwire.metrics``) runs on the I/O
  thread as soon as it arrives, while a step or a state-changing method runs on
  the loop's thread. It must be safe to run concurrently with the loop: read
  values the loop replaces whole (a snapshot it publishes between steps), not
  structures it mutates in place. Async and ``threaded`` handlers stay where
  ``serve`` runs them (the I/O thread, a worker thread).
* **State-changing methods run on the loop's thread, between steps.** Every
  other sync method is handed to the loop and runs inside :meth:`poll` (or
  :meth:`run_blocking`), never concurrently with a step or with another one.
  Per method, requests run in arrival order, one at a time (``concurrency``
  of the method); across methods, in the order they reach the loop. The
  handler's result or exception is the request's reply, sent by the I/O thread;
  :func:`~ctlwire.kernel.engine.liveness.report_progress` works from it.
* **Bounded.** Calls waiting for the loop are at most one per in-flight
  request of a state-changing method (each method's ``concurrency``), since
  each waits in its method's lane.
* **Nothing waits for ever on a stopped loop.** After :meth:`close`, calls
  waiting for the loop (and those that arrive) fail with :class:`LoopStopped`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from types import TracebackType
from typing import Any

from anyio.from_thread import start_blocking_portal

from ctlwire.kernel.core.inbound_core import MethodSpec
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.errors import CtlwireError

__all__ = ["BusyLoop", "LoopStopped"]


class LoopStopped(CtlwireError, RuntimeError):
    """The busy loop was closed before it ran the call."""


class _Call:
    """One state-changing request's handler call, waiting for the loop's thread."""

    __slots__ = ("args", "context", "fn", "future")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args
        # the request's context (its id for report_progress, its trace)
        self.context = contextvars.copy_context()
        self.future: Future[Any] = Future()

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            result = self.context.run(self.fn, *self.args)
        except BaseException as exc:
            self.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            self.future.set_result(result)


class BusyLoop:
    """A synchronous engine loop whose endpoint is served by an I/O thread; see the module.

    ``backend`` is the I/O thread's anyio backend (``"asyncio"`` or ``"trio"``)."""

    def __init__(self, endpoint: EngineEndpoint, *, backend: str = "asyncio") -> None:
        if endpoint.methods:
            raise ValueError("create the BusyLoop before registering methods on its endpoint "
                             f"(already registered: {', '.join(endpoint.methods)})")
        self.endpoint = endpoint
        self.backend = backend
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._closed = False
        self._stack: contextlib.ExitStack | None = None
        self._serving: Future[Any] | None = None
        #: state-changing calls the loop ran
        self.calls_run = 0
        endpoint.method_table.place_handler = self._place

    @property
    def waiting(self) -> int:
        """State-changing calls waiting for the loop's thread."""
        return self._calls.qsize()

    # -- the seam: where a sync handler runs ------------------------------------------
    def _place(self, spec: MethodSpec) -> MethodSpec:
        """A state-changing sync method runs on the loop's thread: its handler becomes
        one that hands the call over and waits (in ``serve``'s worker thread)."""
        if spec.read_only or spec.is_async or spec.threaded:
            return spec
        return replace(spec, handler=self._handed_off(spec.handler), threaded=True)

    def _handed_off(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def hand_off(*args: Any) -> Any:
            call = _Call(fn, args)
            self._calls.put(call)
            if self._closed:  # close() may have drained the queue before the put
                self._fail_waiting()
            return call.future.result()
        return hand_off

    # -- the I/O thread ---------------------------------------------------------------
    def start(self) -> None:
        """Start the I/O thread; returns once the endpoint serves (transport open)."""
        if self._stack is not None:
            return
        if self._closed:
            raise LoopStopped("the busy loop was closed")
        with contextlib.ExitStack() as stack:
            portal = stack.enter_context(start_blocking_portal(self.backend))
            self._serving, _ = portal.start_task(self.endpoint.serve)
            self._stack = stack.pop_all()

    def close(self) -> None:
        """Stop serving: calls waiting for the loop fail with :class:`LoopStopped`, the
        I/O thread ends (the transport closed). Idempotent. Call it from the loop's
        thread (or once the loop no longer polls): a call it is running is waited for."""
        self._closed = True
        self._fail_waiting()
        stack, self._stack = self._stack, None
        if stack is not None:
            assert self._serving is not None
            self._serving.cancel()
            stack.close()

    def __enter__(self) -> BusyLoop:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _fail_waiting(self) -> None:
        while True:
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                return
            call.future.set_exception(LoopStopped("the busy loop was closed"))

    # -- the loop's thread --------------------------------------------------------------
    def poll(self, max_calls: int = 64) -> int:
        """Run up to ``max_calls`` state-changing calls waiting for the loop, on this
        thread, without blocking. Returns how many ran."""
        if self._closed:
            raise LoopStopped("poll() after close()")
        ran = 0
        while ran < max_calls:
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                break
            call.run()
            ran += 1
        self.calls_run += ran
        return ran

    def idle_wait(self, timeout: float) -> int:
        """Block up to ``timeout`` seconds for a state-changing call, run it and any
        others waiting (:meth:`poll`); how many ran. For a loop with nothing to step."""
        if self._closed:
            raise LoopStopped("idle_wait() after close()")
        try:
            call = self._calls.get(timeout=timeout)
        except queue.Empty:
            return 0
        call.run()
        self.calls_run += 1
        return 1 + self.poll()

    def run_blocking(self, stop: threading.Event | None = None, *,
                     step: Callable[[], object] | None = None, idle_wait: float = 0.05) -> None:
        """The loop: ``step()`` (your work) then :meth:`poll`; when there is no
        ``step`` or it returned a false value (nothing to do), :meth:`idle_wait`
        up to ``idle_wait`` seconds. Starts the I/O thread if needed; runs until
        ``stop`` is set, then closes."""
        self.start()
        try:
            while stop is None or not stop.is_set():
                worked = step() if step is not None else False
                self.poll()
                if not worked:
                    self.idle_wait(idle_wait)
        finally:
            self.close()
