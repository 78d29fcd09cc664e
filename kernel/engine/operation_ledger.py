"""The engine side of operations: validated, fenced, once-only steps, recorded per operation.

::

    ledger = OperationLedger({"pause": engine.pause, "update_weights": engine.update_weights,
                              "restore_weights": engine.restore_weights,
                              "resume": engine.resume})
    ledger.install(endpoint)   # ctlwire.step, ctlwire.last_operation, ctlwire.step_methods

An operation's steps reach the engine as ``ctlwire.step`` requests carrying a
:class:`StepRequest` (operation id, step, its position in the plan, phase,
fencing token, idempotency key, the ranks of the operation, the method to run
and its encoded arguments). Every field is checked before anything changes;
a refused step does not run, does not raise the fence and is not recorded.
The ledger guarantees, per engine:

* **Well-formed.** The phase is ``"apply"`` or ``"compensate"``; the fencing
  token is a positive int no further ahead of this engine's clock than
  ``max_fence_lead`` seconds (tokens are microseconds since the epoch, see
  :mod:`~ctlwire.kernel.core.fencing`); the key is the step's own
  (:func:`~ctlwire.kernel.core.operation_plan.step_key`); the method is one of
  the ledger's. Otherwise :class:`InvalidStep` (422), or :class:`UnknownStepMethod`.
* **Fencing.** It keeps the highest token it has accepted; a step with a lower
  token is refused with an error the client sees as
  :class:`~ctlwire.kernel.errors.Fenced` (``type "Fenced"``, code 409).
* **An operation belongs to the controller that began it.** An operation is
  begun by its first step (position 0) and bound to that step's token and
  peer: the connection it came on (or the key its transport names for it)
  (:func:`~ctlwire.kernel.engine.liveness.current_peer`) -- nothing a request
  carries, so no peer can claim it by copying numbers it read. A step of it
  carrying the same token from another peer is refused (:class:`OperationOwned`);
  a newer token takes the operation over (a successor finishing it, or a
  controller whose connection was re-established without CURVE: a new
  connection is a new peer) and fences the old controller out.
* **Plan order.** A forward step runs only at the next position of its
  operation here (:class:`StepOutOfOrder` otherwise); a step already applied
  at that position answers its recorded result and does not run again.
* **Compensation only for what applied here.** A compensation runs only for a
  step this ledger applied in that operation and did not undo yet
  (:class:`StepNotApplied` otherwise: nothing to undo); a repeated one answers
  its recorded result. Once a compensation ran, forward steps of the
  operation are refused (:class:`OperationAborted`).
* **Recorded after success only.** A step is recorded once its handler
  returned; a step that raised is not recorded and its retry runs it. A refused
  step's error is a :class:`~ctlwire.kernel.core.inbound_core.Refused`: the
  engine does not record it under the request's idempotency key either.
  ``async def`` handlers are awaited (the ledger's step is then served by
  :meth:`~ctlwire.kernel.engine.endpoint.EngineEndpoint.serve`); with
  ``threaded=True`` sync handlers run in a worker thread, so the engine
  answers other methods while a long step runs.
* **Bounded.** The newest ``max_operations`` operations are remembered.
* **Recovery.** ``ctlwire.last_operation`` answers :class:`LastOperation`: the
  operation last applied here, its token and ranks, every step applied and
  every compensation run, so a successor can compute what remains; the answer
  is one consistent view even when read on another thread than the steps run on
  (:class:`~ctlwire.kernel.engine.busy_loop.BusyLoop`). ``ctlwire.take_over``
  (:class:`TakeOver`) first raises the fence to the successor's, so no older
  controller changes anything after the answer (refused with
  :class:`StepInFlight` while a step runs). It is served apart from the steps
  (``threaded``: a worker thread beside a busy loop's thread or an event loop),
  so it sees a step that runs; a poll loop, one thread for both, reads it only
  once the step returned.
  ``ctlwire.step_methods`` lists the methods this ledger runs as steps.
* **Abort.** ``ctlwire.abort_step`` (served like ``ctlwire.take_over``) lets the
  running step's own controller ask its handler to stop
  (:mod:`~ctlwire.kernel.engine.step_abort`: :func:`step_aborted`).

Request-level checks (``Request.key``, ``Request.fence``) are the endpoint's own.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
import msgspec

from ctlwire.kernel.core.operation_plan import step_key
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.engine.ledger_messages import LastOperation, StepRequest, TakeOver
from ctlwire.kernel.engine.liveness import current_peer, current_request_id
from ctlwire.kernel.engine.method_table import handler_payload
from ctlwire.kernel.engine.step_abort import (
    ABORT_STEP_METHOD,
    AbortStep,
    RunningStep,
    enter_step,
    leave_step,
    step_aborted,
)
from ctlwire.kernel.engine.step_refusals import (
    Fenced,
    InvalidStep,
    OperationAborted,
    OperationOwned,
    StepInFlight,
    StepNotApplied,
    StepOutOfOrder,
    UnknownStepMethod,
)
from ctlwire.transports.codec import Codec, PayloadTypeError

__all__ = ["ABORT_STEP_METHOD", "LAST_OPERATION_METHOD", "PHASES", "STEP_METHOD",
           "STEP_METHODS_METHOD", "TAKE_OVER_METHOD", "AbortStep", "InvalidStep",
           "LastOperation", "OperationAborted", "OperationLedger", "OperationOwned",
           "StepInFlight", "StepNotApplied", "StepOutOfOrder", "StepRequest", "TakeOver",
           "UnknownStepMethod", "step_aborted"]

STEP_METHOD = "ctlwire.step"
LAST_OPERATION_METHOD = "ctlwire.last_operation"
STEP_METHODS_METHOD = "ctlwire.step_methods"
TAKE_OVER_METHOD = "ctlwire.take_over"
PHASES = frozenset({"apply", "compensate"})


@dataclass
class _Handler:
    fn: Callable[..., Any]
    takes_payload: bool
    optional: bool
    payload_type: Any
    is_async: bool


@dataclass
class _OpRecord:
    """One operation as this ledger applied it."""

    op: str
    fence: int
    owner: Hashable
    ranks: list[int]
    steps: list[str] = field(default_factory=list)       # forward steps, plan order
    methods: list[str] = field(default_factory=list)     # the method each ran
    undone: list[str] = field(default_factory=list)      # compensations, order run
    history: list[str] = field(default_factory=list)     # both, order run
    results: dict[str, Any] = field(default_factory=dict)  # "step" / "step:undo" -> result


@dataclass
class _Admitted:
    """A step that passed every check and must run: what to record once it returned."""

    req: StepRequest
    handler: _Handler
    args: tuple[Any, ...]
    owner: Hashable
    running: RunningStep


def _peer() -> Hashable:
    """The peer of the step being handled (its connection; None outside a request)."""
    return current_peer()


class OperationLedger:
    """Runs operation steps on one engine: validated, fenced, once, recorded."""

    def __init__(self, handlers: Mapping[str, Callable[..., Any]], *,
                 max_operations: int = 64, threaded: bool = False,
                 max_fence_lead: float = 300.0,
                 clock: Callable[[], float] = time.time) -> None:
        self._handlers: dict[str, _Handler] = {}
        for name, fn in handlers.items():  # the scope constructing the ledger: 1 frame up
            self._handlers[name] = _Handler(fn, *handler_payload(name, fn),
                                            inspect.iscoroutinefunction(fn))
        if max_operations < 1:
            raise ValueError("max_operations must be >= 1")
        self.max_operations = max_operations
        self.threaded = threaded
        self.max_fence_lead = max_fence_lead
        self.clock = clock
        self._ops: OrderedDict[str, _OpRecord] = OrderedDict()
        self._view: LastOperation | None = None  # the last applied, replaced whole
        self.highest_fence = 0
        self.rank = -1
        self.codec: Codec | None = None
        self._endpoint: EngineEndpoint | None = None
        self._running: RunningStep | None = None  # the step whose body runs now
        self._lock = threading.Lock()  # admitting a step, recording it, a take-over, an abort
        self.counters: dict[str, int] = dict.fromkeys(
            ("applied", "replayed", "fenced", "step_errors", "refused", "taken_over",
             "take_overs", "aborts"), 0)
        self.runs: dict[str, int] = {}

    @property
    def is_async(self) -> bool:
        """Whether ``ctlwire.step`` must be served by ``serve()`` (async or threaded steps)."""
        return self.threaded or any(h.is_async for h in self._handlers.values())

    def install(self, endpoint: EngineEndpoint) -> None:
        """Register ``ctlwire.step``, ``ctlwire.last_operation`` and
        ``ctlwire.step_methods`` on ``endpoint``."""
        self.rank = endpoint.rank
        self.codec = endpoint.codec
        self._endpoint = endpoint
        if self.is_async:
            endpoint.register(STEP_METHOD, self.step_async)
        else:
            endpoint.register(STEP_METHOD, self.step)
        endpoint.register(LAST_OPERATION_METHOD, self.last_operation, read_only=True)
        endpoint.register(STEP_METHODS_METHOD, self.step_methods, read_only=True)
        # threaded: served apart from the steps (a busy loop's thread, a worker), so
        # a take-over sees a step that runs and is refused StepInFlight; control:
        # under serve() on the receive loop as they arrive, never queued behind data
        endpoint.register(TAKE_OVER_METHOD, self.take_over, threaded=True, control=True)
        endpoint.register(ABORT_STEP_METHOD, self.abort_step, threaded=True, control=True)

    # -- the step ------------------------------------------------------------------
    def step(self, req: StepRequest) -> Any:
        """Run one step inline (sync handlers): checked, then run, then recorded."""
        admitted = self._start(req, inline=True)
        if not isinstance(admitted, _Admitted):
            return admitted[0]
        token = enter_step(admitted.running)
        try:
            result = admitted.handler.fn(*admitted.args)
        except BaseException as exc:
            self._stop(exc)
            raise
        finally:
            leave_step(token)
        return self._finish(admitted, result)

    async def step_async(self, req: StepRequest) -> Any:
        """Run one step under ``serve()``: async handlers awaited, sync ones in a
        worker thread when the ledger is ``threaded``; recorded after they returned."""
        admitted = self._start(req)
        if not isinstance(admitted, _Admitted):
            return admitted[0]
        fn = admitted.handler.fn
        token = enter_step(admitted.running)  # a worker thread runs in a copy of it
        try:
            if admitted.handler.is_async:
                result = await fn(*admitted.args)
            elif self.threaded:
                result = await anyio.to_thread.run_sync(fn, *admitted.args)
            else:
                result = fn(*admitted.args)
        except BaseException as exc:
            self._stop(exc)
            raise
        finally:
            leave_step(token)
        return self._finish(admitted, result)

    def _start(self, req: StepRequest, *, inline: bool = False) -> _Admitted | tuple[Any]:
        """Admit ``req`` and mark its step running: one move, under the lock a
        take-over (served on another thread) takes too."""
        with self._lock:
            admitted = self._admit(req)
            if isinstance(admitted, _Admitted):
                if inline and admitted.handler.is_async:
                    raise InvalidStep(f"{req.method!r} is async; serve the engine with serve()")
                self._running = admitted.running
            return admitted

    def _stop(self, exc: BaseException) -> None:
        """The step's body raised: nothing recorded."""
        with self._lock:
            self._running = None
        if isinstance(exc, Exception):
            self.counters["step_errors"] += 1

    def _finish(self, admitted: _Admitted, result: Any) -> Any:
        with self._lock:
            self._running = None
            return self._record(admitted, result)

    def _refuse(self, exc: Exception) -> Exception:
        self.counters["refused"] += 1
        return exc

    def _check_fence(self, fence: int, what: str) -> None:
        """A fencing token is a positive int no further ahead of this engine's clock
        than ``max_fence_lead`` (InvalidStep otherwise)."""
        if type(fence) is not int or fence <= 0:
            raise self._refuse(InvalidStep(f"{what}: a positive fencing token is required, "
                                           f"got {fence!r}"))
        bound = int((self.clock() + self.max_fence_lead) * 1_000_000)
        if fence > bound:
            raise self._refuse(InvalidStep(
                f"{what}: fence {fence} is beyond this engine's clock (tokens are "
                f"microseconds since the epoch; bound {bound})"))

    def take_over(self, req: TakeOver) -> LastOperation:
        """A successor controller: raise the fence to ``req.fence`` (every older
        controller is refused from now on), then answer what this ledger applied.
        Refused while a step runs here (:class:`StepInFlight`: ask again), so the
        answer is not overtaken by a step an older controller had started."""
        self._check_fence(req.fence, "take-over")
        with self._lock:
            if req.fence < self.highest_fence:
                self.counters["fenced"] += 1
                raise Fenced(f"take-over with fence {req.fence} is older than fence "
                             f"{self.highest_fence} already accepted by rank {self.rank}")
            if self._running is not None:
                raise StepInFlight(f"step {self._running.step!r} is running on rank "
                                   f"{self.rank}; ask again once it returned")
            self.highest_fence = req.fence
            self.counters["take_overs"] += 1
            return self.last_operation()

    def abort_step(self, req: AbortStep) -> bool:
        """Ask the running step ``req`` names to stop (see
        :mod:`~ctlwire.kernel.engine.step_abort`): True when it runs here and now
        sees :func:`step_aborted`, False when it is not running. Raises
        :class:`Fenced` for a token older than the highest accepted,
        :class:`OperationOwned` for another peer's or another token's step."""
        self._check_fence(req.fence, "abort")
        with self._lock:
            if req.fence < self.highest_fence:
                self.counters["fenced"] += 1
                raise Fenced(f"abort with fence {req.fence} is older than fence "
                             f"{self.highest_fence} already accepted by rank {self.rank}")
            running = self._running
            if running is None or not running.matches(req):
                return False
            if (req.fence, _peer()) != (running.fence, running.owner):
                raise self._refuse(OperationOwned(
                    f"step {req.step!r} of operation {req.op!r} runs for the controller "
                    "that sent it; only it may abort it"))
            if not running.aborted.is_set():
                running.aborted.set()
                self.counters["aborts"] += 1
            return True

    def _admit(self, req: StepRequest) -> _Admitted | tuple[Any]:
        """Every check, changing nothing but the fence; a recorded result as ``(result,)``."""
        if req.phase not in PHASES:
            raise self._refuse(InvalidStep(f"phase {req.phase!r} is not one of {sorted(PHASES)}"))
        self._check_fence(req.fence, f"operation {req.op!r}")
        undo = req.phase == "compensate"
        if not req.op or not req.step or req.key != step_key(req.op, req.step, undo):
            raise self._refuse(InvalidStep(
                f"operation {req.op!r} step {req.step!r}: key {req.key!r} is not the step's own"))
        handler = self._handlers.get(req.method)
        if handler is None:
            raise self._refuse(UnknownStepMethod(
                f"{req.method!r} is not an operation step on this engine"))
        if not undo and req.index < 0:
            raise self._refuse(InvalidStep(f"operation {req.op!r} step {req.step!r}: a forward "
                                           "step carries its position in the plan"))
        if req.fence < self.highest_fence:
            self.counters["fenced"] += 1
            raise Fenced(f"operation {req.op!r} (fence {req.fence}) is older than fence "
                         f"{self.highest_fence} already accepted by rank {self.rank}")
        owner = _peer()
        rec = self._ops.get(req.op)
        if rec is not None and req.fence == rec.fence and owner != rec.owner:
            raise self._refuse(OperationOwned(
                f"operation {req.op!r} belongs to the controller that began it (fence "
                f"{rec.fence}); a successor takes it over with a newer fence"))
        if undo:
            if rec is None or req.step not in rec.steps:
                raise self._refuse(StepNotApplied(
                    f"operation {req.op!r}: step {req.step!r} was not applied on rank "
                    f"{self.rank}; nothing to undo"))
            if req.step in rec.undone:
                return self._replay(rec, f"{req.step}:undo", req)
        else:
            if rec is None:
                if req.index != 0:
                    raise self._refuse(StepOutOfOrder(
                        f"operation {req.op!r} is unknown on rank {self.rank}; its step "
                        f"{req.step!r} (position {req.index}) cannot come first"))
            else:
                if rec.undone:
                    raise self._refuse(OperationAborted(
                        f"operation {req.op!r} was compensated on rank {self.rank}; start a "
                        "new operation"))
                if req.index < len(rec.steps):
                    if rec.steps[req.index] != req.step or rec.methods[req.index] != req.method:
                        raise self._refuse(StepOutOfOrder(
                            f"operation {req.op!r}: position {req.index} is "
                            f"{rec.steps[req.index]!r} here, not {req.step!r}"))
                    return self._replay(rec, req.step, req)
                if req.index > len(rec.steps) or req.step in rec.steps:
                    raise self._refuse(StepOutOfOrder(
                        f"operation {req.op!r}: step {req.step!r} (position {req.index}) "
                        f"after {rec.steps} on rank {self.rank}"))
        args: tuple[Any, ...] = ()
        assert self.codec is not None, "install() the ledger on an endpoint first"
        if handler.takes_payload:
            try:
                value = self.codec.decode_value(req.args, handler.payload_type)
            except PayloadTypeError as exc:
                if not (handler.optional and self._is_nil(req.args)):
                    raise self._refuse(InvalidStep(f"{req.method!r}: {exc}")) from None
            else:
                if not (handler.optional and value is None):
                    args = (value,)
        # fully validated: the step may now raise the fence (it belongs to the newest
        # controller) and say what it runs to whoever watches this engine's heartbeats
        self.highest_fence = max(self.highest_fence, req.fence)
        self._show_running(req.method)
        return _Admitted(req, handler, args, owner,
                         RunningStep(req.op, req.step, req.phase, req.fence, owner))

    def _is_nil(self, raw: msgspec.Raw) -> bool:
        """Whether ``raw`` is an encoded None (no payload for an optional one)."""
        assert self.codec is not None
        try:
            return self.codec.decode_value(raw) is None
        except PayloadTypeError:
            return False

    def _replay(self, rec: _OpRecord, name: str, req: StepRequest) -> tuple[Any]:
        self.highest_fence = max(self.highest_fence, req.fence)
        self._take_over(rec, req.fence, _peer())
        self.counters["replayed"] += 1
        return (rec.results.get(name),)

    def _take_over(self, rec: _OpRecord, fence: int, owner: Hashable) -> None:
        if (fence, owner) != (rec.fence, rec.owner):
            self.counters["taken_over"] += 1
            rec.fence, rec.owner = fence, owner
            if self._view is not None and self._view.op == rec.op:
                self._view = msgspec.structs.replace(self._view, fence=fence)

    def _show_running(self, method: str) -> None:
        """Name the step's own method as what the engine is running (heartbeats, rank_status)."""
        rid = current_request_id()
        endpoint = self._endpoint
        if rid and endpoint is not None and rid in endpoint.running:
            endpoint.running[rid] = (method, endpoint.running[rid][1])

    def _record(self, admitted: _Admitted, result: Any) -> Any:
        req = admitted.req
        self.counters["applied"] += 1
        self.runs[req.method] = self.runs.get(req.method, 0) + 1
        rec = self._ops.get(req.op)
        if rec is None:
            rec = _OpRecord(req.op, req.fence, admitted.owner, list(req.ranks))
            self._ops[req.op] = rec
            while len(self._ops) > self.max_operations:
                self._ops.popitem(last=False)
        else:
            self._take_over(rec, req.fence, admitted.owner)
            self._ops.move_to_end(req.op)
        if req.phase == "compensate":
            name = f"{req.step}:undo"
            rec.undone.append(req.step)
        else:
            name = req.step
            rec.steps.append(req.step)
            rec.methods.append(req.method)
        rec.history.append(name)
        rec.results[name] = result
        self._view = LastOperation(self.rank, rec.op, req.step, req.phase, rec.fence,
                                   list(rec.history), 0, list(rec.steps), list(rec.undone),
                                   list(rec.ranks))
        return result

    # -- read-only ---------------------------------------------------------------------
    def last_operation(self) -> LastOperation:
        """The operation last applied here, what of it applied, its token and ranks."""
        view = self._view
        if view is None:
            return LastOperation(self.rank, highest_fence=self.highest_fence)
        return msgspec.structs.replace(view, highest_fence=self.highest_fence)

    def step_methods(self) -> list[str]:
        """The methods this ledger runs as operation steps."""
        return sorted(self._handlers)

    def metrics(self) -> dict[str, Any]:
        last = self._view
        return {"highest_fence": self.highest_fence, "last_op": last.op if last else "",
                "last_step": last.step if last else "", "runs": dict(self.runs),
                "operations": len(self._ops), **self.counters}
