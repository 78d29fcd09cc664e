"""OpenTelemetry spans on both sides of a control request (the ``tracing`` extra).

Built on :mod:`ctlwire.kernel.observability.tracing`: the W3C trace context of each request
travels in its envelope, and the engine continues it. OpenTelemetry is imported
only when one of these is used (``pip install 'ctlwire[tracing]'``):

* :class:`ClientTracing` -- ``ClientTracing().install(client)``: one CLIENT span
  per control request (from its first send to its cleanup, named
  ``ctlwire.call <method>``, ended with the request's outcome: ``ctlwire.outcome``
  is DONE, PARTIAL, FAILED, TIMED_OUT or CANCELLED as
  :mod:`~ctlwire.kernel.core.request_outcome` defines them, the status ERROR for
  all but DONE, and one event per rank that failed or was left out), a child
  of whatever span is current where the call is made; its W3C trace context
  goes in the envelope.
* :meth:`ClientTracing.operation` -- a span for an operation and one per step
  (and per compensation), around ``OperationRunner.run``; each step's control
  request is a child of its step's span.
* :func:`traced` -- wraps an engine handler in a SERVER span that continues the
  caller's trace (``@endpoint.method()`` over ``@traced()``, or the functions
  given to an ``OperationLedger``), with the method, the engine's rank and the
  outcome as attributes. A carrier whose ``traceparent`` is not valid W3C is
  counted (:data:`~ctlwire.kernel.observability.tracing.trace_contexts`) and the handler
  runs in a new root span.

Spans use the global tracer provider and propagator unless given others.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from ctlwire.kernel.core.request_outcome import request_outcome
from ctlwire.kernel.engine.liveness import current_rank, current_request_id
from ctlwire.kernel.observability.tracing import current_trace, trace_contexts

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from ctlwire.kernel.client.control_client import ControlClient
    from ctlwire.kernel.core.operation_result import ProgressEvent
    from ctlwire.kernel.core.request_registry import PendingRequest
    from ctlwire.states import RequestEvent, RequestState

__all__ = ["TRACER_NAME", "ClientTracing", "traced"]

TRACER_NAME = "ctlwire"
_F = TypeVar("_F", bound=Callable[..., Any])


def _tracer(tracer: Tracer | None) -> Tracer:
    if tracer is not None:
        return tracer
    from opentelemetry import trace

    from ctlwire.kernel._version import __version__

    return trace.get_tracer(TRACER_NAME, __version__)


class ClientTracing:
    """OpenTelemetry spans for a :class:`~ctlwire.kernel.ControlClient`'s requests.

    A transition observer and a trace provider in one: the request's span starts
    when its first frame is about to leave (in the caller's task, under the
    caller's current span) and its context is what the envelope carries; the
    span ends when the request is cleaned. Its ``ctlwire.outcome`` follows what
    the ranks answered (:func:`~ctlwire.kernel.core.request_outcome.request_outcome`):
    every outcome but DONE sets an error status, and every rank that answered
    with an error, failed locally (lost, not delivered) or was left out is one
    event (``rank failed``, ``rank left out``). Costs nothing on a client it is
    not installed on.
    """

    def __init__(self, tracer: Tracer | None = None) -> None:
        self.tracer = _tracer(tracer)
        self._spans: dict[int, Span] = {}
        # the span of the request being sent right now: set by the observer at the
        # send transition and taken by the provider in the same synchronous step
        self._sending: Span | None = None

    def install(self, client: ControlClient) -> ClientTracing:
        """Observe ``client``'s requests and carry their context; returns self."""
        client.registry.observers.append(self.observe)
        client.trace_provider = self.carrier
        return self

    @property
    def open_spans(self) -> int:
        """Spans of requests not cleaned yet (0 once the client is idle)."""
        return len(self._spans)

    def observe(self, entry: PendingRequest, old: RequestState, event: RequestEvent,
                new: RequestState) -> None:
        """The transition observer (see ``ControlClient(observer=...)``)."""
        span = self._spans.get(entry.id)
        if span is None:
            if new.name != "SENT":
                return
            from opentelemetry.trace import SpanKind

            span = self.tracer.start_span(f"ctlwire.call {entry.method}", kind=SpanKind.CLIENT,
                                          attributes={"ctlwire.request_id": entry.id,
                                                      "ctlwire.method": entry.method,
                                                      "ctlwire.ranks": list(entry.ranks)})
            self._spans[entry.id] = self._sending = span
            return
        if entry.is_terminal:
            self._end_outcome(span, entry)
        elif new.name == "CLEANED":
            del self._spans[entry.id]
            if self._sending is span:
                self._sending = None
            span.end()

    @staticmethod
    def _end_outcome(span: Span, entry: PendingRequest) -> None:
        """The request is decided: its outcome, status and per-rank failures."""
        from opentelemetry.trace import Status, StatusCode

        outcome = request_outcome(entry)
        span.set_attribute("ctlwire.outcome", outcome)
        failed = 0
        for rank in entry.ranks:
            reply = entry.replies.get(rank)
            if reply is not None:
                if reply.ok:
                    continue
                info = reply.error
                attributes: dict[str, Any] = {
                    "ctlwire.rank": rank,
                    "exception.type": info.type if info is not None else "RemoteError",
                    "exception.message": info.message if info is not None else ""}
                if info is not None:
                    attributes["ctlwire.error_code"] = info.code
            elif (error := entry.errors.get(rank)) is not None:
                attributes = {"ctlwire.rank": rank, "exception.type": type(error).__name__,
                              "exception.message": str(error)}
            else:
                continue  # no outcome: the policy was met without it
            failed += 1
            span.add_event("rank failed", attributes)
        for rank, why in sorted((entry.left_out or {}).items()):
            span.add_event("rank left out", {"ctlwire.rank": rank, "ctlwire.reason": why})
        if outcome != "DONE":
            left = len(entry.left_out or ())
            span.set_status(Status(StatusCode.ERROR, (
                f"{outcome.lower()}: {failed} of {len(entry.ranks)} ranks failed"
                + (f", {left} left out" if left else ""))))

    def carrier(self) -> dict[str, str] | None:
        """The trace provider: the W3C trace context of the request being sent."""
        from opentelemetry import propagate, trace

        span, self._sending = self._sending, None
        carrier: dict[str, str] = {}
        context = trace.set_span_in_context(span) if span is not None else None
        propagate.inject(carrier, context=context)
        return carrier or None

    @contextmanager
    def operation(self, name: str) -> Iterator[Callable[[ProgressEvent], None]]:
        """A span for one operation and one per step, as an ``on_progress`` callback::

            with tracing.operation("weight-update") as on_progress:
                result = await runner.run(plan, on_progress=on_progress)

        Each step (and each compensation, ``undo <step>``) gets its own span,
        current while its control request is sent, so that request and the
        engines' handling of it are its children. Rank state changes and the
        ranks' progress reports are span events. Enter and leave it in the task
        that awaits ``runner.run``.
        """
        from opentelemetry import context as otel_context
        from opentelemetry import trace

        op_span = self.tracer.start_span(f"ctlwire.operation {name}")
        op_token = otel_context.attach(trace.set_span_in_context(op_span))
        step: list[Any] = [None, None, None]  # (step, phase), span, token

        def end_step() -> None:
            if step[1] is not None:
                otel_context.detach(step[2])
                step[1].end()
                step[:] = [None, None, None]

        def on_progress(ev: ProgressEvent) -> None:
            key = (ev.step, ev.phase)
            if step[0] != key:
                end_step()
                label = ev.step if ev.phase == "apply" else f"undo {ev.step}"
                span = self.tracer.start_span(
                    f"ctlwire.step {label}", context=trace.set_span_in_context(op_span),
                    attributes={"ctlwire.operation": ev.op_id, "ctlwire.step": ev.step,
                                "ctlwire.phase": ev.phase})
                step[:] = [key, span, otel_context.attach(trace.set_span_in_context(span))]
                op_span.set_attribute("ctlwire.operation", ev.op_id)
            attributes: dict[str, Any] = {"ctlwire.rank": ev.rank, "ctlwire.state": ev.state.name}
            if ev.fraction is not None:  # the rank's own report, while the step runs there
                step[1].add_event("rank progress", {**attributes, "ctlwire.fraction": ev.fraction,
                                                    "ctlwire.note": ev.note})
                return
            if ev.detail:
                attributes["ctlwire.detail"] = ev.detail
            step[1].add_event("rank state", attributes)

        try:
            yield on_progress
        except BaseException as exc:
            op_span.record_exception(exc)
            raise
        finally:
            end_step()
            otel_context.detach(op_token)
            op_span.end()


def traced(name: str | None = None, *, tracer: Tracer | None = None) -> Callable[[_F], _F]:
    """Decorate an engine handler: it runs in a SERVER span (``ctlwire.handle
    <name>``, default the function's name) that continues the trace the request
    carried (:data:`current_trace`), or starts one when it carried none or one
    that is not valid W3C (counted in :data:`~ctlwire.kernel.observability.tracing.trace_contexts`
    and marked ``ctlwire.trace_context=invalid``). The span's attributes:
    ``ctlwire.method`` (``name``), ``ctlwire.rank`` and ``ctlwire.request_id``
    (inside an engine's handler) and ``ctlwire.outcome``: ``ok``, ``error`` (the
    exception is recorded, the status ERROR) or ``cancelled``. Signature and
    annotations are kept, so payload validation is unchanged."""

    def deco(fn: _F) -> _F:
        method = name or fn.__name__
        span_name = f"ctlwire.handle {method}"

        @contextmanager
        def handling() -> Iterator[None]:
            from opentelemetry import propagate
            from opentelemetry.trace import SpanKind

            carrier = current_trace.get()
            verdict = trace_contexts.check(carrier)
            parent = propagate.extract(carrier if verdict == "continued" else {})
            attributes: dict[str, Any] = {"ctlwire.method": method}
            rank, request_id = current_rank(), current_request_id()
            if rank is not None:
                attributes["ctlwire.rank"] = rank
            if request_id is not None:
                attributes["ctlwire.request_id"] = request_id
            if verdict == "invalid":
                attributes["ctlwire.trace_context"] = "invalid"
            with _tracer(tracer).start_as_current_span(span_name, context=parent,
                                                       kind=SpanKind.SERVER,
                                                       attributes=attributes) as span:
                outcome = "cancelled"  # unless it returns or raises an Exception
                try:
                    yield
                    outcome = "ok"
                except Exception:
                    outcome = "error"
                    raise
                finally:
                    span.set_attribute("ctlwire.outcome", outcome)

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with handling():
                    return await fn(*args, **kwargs)

            return run_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with handling():
                return fn(*args, **kwargs)

        return run  # type: ignore[return-value]

    return deco
