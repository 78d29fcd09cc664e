"""Where and how an admitted request's handler runs: the one seam between the
inbound core's decisions and the user's code.

Guarantees: while a handler runs, its request is in the liveness part's
``running`` table (what heartbeats report) and :func:`report_progress` reaches
it; its trace carrier is current; every outcome goes through the inbound core
(a result or an exception gives the one ``Replied`` reply; a run that ends with
neither, cancelled, or that the handler refused (:class:`Refused`) forgets its
idempotency key). A handler's exception never
escapes; a ``BaseException`` (cancellation, KeyboardInterrupt) does, after the
bookkeeping.
"""

from __future__ import annotations

import anyio
import anyio.to_thread

from ctlwire.kernel.core.inbound_core import InboundCore, InboundRequest, Refused
from ctlwire.kernel.engine.liveness import EngineLiveness
from ctlwire.kernel.errors import CtlwireError
from ctlwire.kernel.tracing import current_trace
from ctlwire.transports.envelope import Reply
from ctlwire.transports.error_codes import ErrorCode

__all__ = ["AsyncHandlerInPoll", "HandlerRunner"]


class HandlerRunner:
    """Runs admitted (Running) requests' handlers; see the module docstring."""

    def __init__(self, core: InboundCore, liveness: EngineLiveness) -> None:
        self.core = core
        self.liveness = liveness

    def run_sync(self, item: InboundRequest) -> Reply:
        """Run a sync handler on the calling thread; an async one is answered with
        ``AsyncHandlerInPoll`` (its key is not kept: a retry under serve runs it)."""
        spec = item.spec
        assert spec is not None
        core = self.core
        if spec.is_async:
            return core.error(item, AsyncHandlerInPoll(
                f"{spec.name!r} is async; serve it with EngineEndpoint.serve()"), record=False)
        req = item.request
        # the trace carrier: set only when there is one to set, or one to clear
        trace = req.trace
        trace_token = (current_trace.set(trace)
                       if trace is not None or current_trace.get() is not None else None)
        live = self.liveness
        token = live.begin(req.id, req.method, item.route, req.client)
        try:
            value = spec.handler(*item.args)
        except Exception as exc:  # a refusal leaves nothing under the key
            return core.error(item, exc, record=not isinstance(exc, Refused))
        except BaseException:
            core.cancelled(item)
            raise
        else:
            return core.result(item, value)
        finally:
            live.end(req.id, token)
            if trace_token is not None:
                current_trace.reset(trace_token)

    async def run_async(self, item: InboundRequest) -> Reply:
        """Run any handler in the calling task: awaited (async), in a worker
        thread (``threaded``), or inline (sync)."""
        spec = item.spec
        assert spec is not None
        core = self.core
        req = item.request
        trace_token = current_trace.set(req.trace)
        token = self.liveness.begin(req.id, req.method, item.route, req.client)
        try:
            if spec.is_async:
                value = await spec.handler(*item.args)
            elif spec.threaded:
                value = await anyio.to_thread.run_sync(spec.handler, *item.args)
            else:
                value = spec.handler(*item.args)
        except Exception as exc:  # a refusal leaves nothing under the key
            return core.error(item, exc, record=not isinstance(exc, Refused))
        except BaseException:
            core.cancelled(item)
            raise
        else:
            return core.result(item, value)
        finally:
            self.liveness.end(req.id, token)
            current_trace.reset(trace_token)


class AsyncHandlerInPoll(CtlwireError):
    """The error reply (501) to a request whose handler is async, run by a loop that
    cannot await it (:meth:`~ctlwire.kernel.engine.endpoint.EngineEndpoint.poll`)."""

    code = ErrorCode.ASYNC_HANDLER_IN_POLL
