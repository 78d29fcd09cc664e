"""The engine side of operations: fenced, idempotent steps and what was last applied.

::

    ledger = OperationLedger({"pause": engine.pause, "update_weights": engine.update_weights,
                              "restore_weights": engine.restore_weights,
                              "resume": engine.resume})
    ledger.install(endpoint)   # registers ctlwire.step and ctlwire.last_operation

An operation's steps reach the engine as ``ctlwire.step`` requests carrying a
:class:`StepRequest` (operation id, step, phase, fencing token, idempotency
key, the method to run and its encoded arguments). The ledger guarantees, per
engine:

* **Fencing.** It keeps the highest fencing token it has accepted; a step with
  a lower (nonzero) token is refused with an error the client sees as
  :class:`~ctlwire.kernel.errors.Fenced` (``type "Fenced"``, code 409) and does
  not run. A stale controller cannot apply a step after its successor started.
* **Once per key.** A step whose key already ran successfully answers with the
  recorded result and does not run again (bounded: the newest ``cache_size``
  keys). A step that raised is not recorded: its retry runs it.
* **No forward step after an undo.** Once a compensation of an operation ran
  here, a forward step of that same operation is refused
  (``OperationAborted``): a retried operation cannot replay recorded results
  over state its compensation already rolled back.
* **Allow-list.** Only the methods handed to the ledger run as steps.
* **Recovery.** ``ctlwire.last_operation`` answers :class:`LastOperation`: the
  operation and step last applied here, the token, and every step of that
  operation applied here, so a restarted controller can tell where it stopped.

These are the operation-level checks; the endpoint's own request-level ones
(``Request.key``, ``Request.fence``) are independent of them.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, get_type_hints

import msgspec

from ctlwire.kernel.engine_endpoint import EngineEndpoint
from ctlwire.kernel.errors import FENCED_CODE
from ctlwire.transports.codec import Codec, PayloadTypeError

__all__ = ["LAST_OPERATION_METHOD", "STEP_METHOD", "LastOperation", "OperationLedger",
           "StepRequest"]

STEP_METHOD = "ctlwire.step"
LAST_OPERATION_METHOD = "ctlwire.last_operation"


class StepRequest(msgspec.Struct, frozen=True):
    """One step (or compensation) of an operation, as sent to an engine."""

    op: str
    step: str
    phase: str
    fence: int
    key: str
    method: str
    args: msgspec.Raw


class LastOperation(msgspec.Struct, frozen=True):
    """What a rank last applied: ``op`` is empty when it never applied a step."""

    rank: int
    op: str = ""
    step: str = ""
    phase: str = ""
    fence: int = 0
    applied: list[str] = msgspec.field(default_factory=list)
    highest_fence: int = 0


class Fenced(Exception):
    """Engine side: a step of an older operation, refused (client: errors.Fenced)."""

    code = FENCED_CODE


class UnknownStepMethod(Exception):
    """A step named a method the ledger was not given."""

    code = 404


class OperationAborted(Exception):
    """A forward step of an operation whose compensation already ran here."""

    code = 410


class InvalidStepPayload(Exception):
    code = 422


def _payload_type(fn: Callable[..., Any]) -> tuple[bool, bool, Any]:
    """(takes a payload, the payload is optional, its declared type)."""
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not params:
        return False, False, Any
    try:
        hints = get_type_hints(fn)
    except Exception:  # unresolvable annotations: accept anything
        hints = {}
    return True, params[0].default is not params[0].empty, hints.get(params[0].name, Any)


class OperationLedger:
    """Runs operation steps on one engine: fenced, once per key, recorded."""

    def __init__(self, handlers: Mapping[str, Callable[..., Any]], *,
                 cache_size: int = 1024) -> None:
        self._handlers = {name: (fn, *_payload_type(fn)) for name, fn in handlers.items()}
        self.cache_size = cache_size
        self._results: OrderedDict[str, Any] = OrderedDict()
        self.highest_fence = 0
        self.rank = -1
        self.codec: Codec | None = None
        self.last = LastOperation(-1)
        self.counters: dict[str, int] = {"applied": 0, "replayed": 0, "fenced": 0,
                                         "step_errors": 0}
        self.runs: dict[str, int] = {}

    def install(self, endpoint: EngineEndpoint) -> None:
        """Register ``ctlwire.step`` and ``ctlwire.last_operation`` on ``endpoint``."""
        self.rank = endpoint.rank
        self.codec = endpoint.codec
        self.last = LastOperation(self.rank)
        endpoint.register(STEP_METHOD, self.step)
        endpoint.register(LAST_OPERATION_METHOD, self.last_operation)

    def step(self, req: StepRequest) -> Any:
        """Run one step: refuse it if fenced out, replay it if its key already ran."""
        if req.fence and req.fence < self.highest_fence:
            self.counters["fenced"] += 1
            raise Fenced(f"operation {req.op!r} (fence {req.fence}) is older than fence "
                         f"{self.highest_fence} already accepted by rank {self.rank}")
        entry = self._handlers.get(req.method)
        if entry is None:
            raise UnknownStepMethod(f"{req.method!r} is not an operation step on this engine")
        self.highest_fence = max(self.highest_fence, req.fence)
        last = self.last
        if req.phase == "apply" and last.op == req.op and last.phase == "compensate":
            raise OperationAborted(f"operation {req.op!r} was compensated on rank {self.rank}; "
                                   f"start a new operation")
        if req.key and req.key in self._results:
            self.counters["replayed"] += 1
            self._results.move_to_end(req.key)
            return self._results[req.key]
        fn, takes_payload, optional, payload_type = entry
        args: tuple[Any, ...] = ()
        assert self.codec is not None, "install() the ledger on an endpoint first"
        if takes_payload and not (optional and self.codec.decode_value(req.args) is None):
            try:
                args = (self.codec.decode_value(req.args, payload_type),)
            except PayloadTypeError as exc:
                raise InvalidStepPayload(f"{req.method!r}: {exc}") from None
        try:
            result = fn(*args)
        except Exception:
            self.counters["step_errors"] += 1
            raise
        self.counters["applied"] += 1
        self.runs[req.method] = self.runs.get(req.method, 0) + 1
        if req.key:
            self._results[req.key] = result
            if len(self._results) > self.cache_size:
                self._results.popitem(last=False)
        name = f"{req.step}:undo" if req.phase == "compensate" else req.step
        applied = [*self.last.applied, name] if self.last.op == req.op else [name]
        self.last = LastOperation(self.rank, req.op, req.step, req.phase, req.fence, applied,
                                  self.highest_fence)
        return result

    def last_operation(self) -> LastOperation:
        """The operation and step last applied here (for a restarted controller)."""
        last = self.last
        return LastOperation(last.rank, last.op, last.step, last.phase, last.fence,
                             list(last.applied), self.highest_fence)

    def metrics(self) -> dict[str, Any]:
        return {"highest_fence": self.highest_fence, "last_op": self.last.op,
                "last_step": self.last.step, "runs": dict(self.runs), **self.counters}
