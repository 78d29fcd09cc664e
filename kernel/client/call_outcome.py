"""Turning a decided request into each holder's outcome: values decoded, errors typed.

:class:`CallOutcomes`, owned by :class:`~ctlwire.kernel.client.call_issuer.CallIssuer`,
reads a decided :class:`~ctlwire.kernel.core.request_registry.PendingRequest`:
values are decoded per holder (each caller gets its own copy, with the codec's
fast decoder for the result type, looked up once per type); failures are
RemoteError, ResultTypeError, EngineDead (NotDelivered, OutcomeUnknown),
RequestTimedOut (with the partial result), FanOutFailed, ClientClosed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import msgspec

from ctlwire.kernel.core.fan_out_result import FanOutResult
from ctlwire.kernel.core.request_registry import PendingRequest
from ctlwire.kernel.errors import (
    BUILTIN_EXCEPTIONS,
    ClientClosed,
    FanOutFailed,
    OutcomeUnknown,
    RequestTimedOut,
    ResultTypeError,
    remote_error,
)
from ctlwire.states import RequestState
from ctlwire.transports.codec import PayloadTypeError
from ctlwire.transports.envelope import ErrorInfo, Reply

__all__ = ["CallOutcomes", "ValueCodec"]

_S = RequestState
# a failed reply that carries no ErrorInfo (a buggy or hostile peer): still a typed error
_NO_ERROR_INFO = ErrorInfo("UnknownRemoteError", "the engine replied ok=false without an error")


class ValueCodec(Protocol):
    """What decodes a reply's result: a :class:`~ctlwire.transports.codec.Codec`, or
    anything that hands values over as they are."""

    def fast_value_codec(self, tp: Any = Any
                         ) -> tuple[Callable[[Any], bytes], Callable[[Any], Any]] | None: ...

    def decode_value(self, raw: msgspec.Raw, tp: Any = Any) -> Any: ...


class CallOutcomes:
    """Each holder's outcome of a decided request; ``closed()`` says whether the
    client closed (a request it failed then raises ClientClosed). ``exceptions``:
    the classes an engine's error is raised as, by name (see
    :func:`~ctlwire.kernel.errors.remote_error`)."""

    def __init__(self, codec: ValueCodec, closed: Callable[[], bool],
                 exceptions: Mapping[str, type[Exception]] = BUILTIN_EXCEPTIONS) -> None:
        self.codec = codec
        self.closed = closed
        self.exceptions = exceptions
        # result type -> the codec's fast decoder for it (None: none, or unhashable)
        self._decoders: dict[Any, Callable[[Any], Any] | None] = {}

    def single_outcome(self, entry: PendingRequest, rank: int, result_type: Any) -> Any:
        """The value ``rank`` answered ``entry`` with (decoded as ``result_type``), or
        that rank's typed error; RequestTimedOut when the request timed out (or is
        still open: the caller's own deadline passed)."""
        state = entry.state
        if state is _S.DONE:
            reply = entry.replies[rank]
            if not reply.ok:
                raise self.remote_error(reply, rank, entry.method)
            try:
                return self.decode_result(reply.result, result_type)
            except PayloadTypeError as exc:
                raise ResultTypeError(f"{entry.method!r} result from rank {rank}: {exc}"
                                      ) from None
        if state is _S.FAILED:
            error = entry.errors.get(rank)
            raise error if error is not None else OutcomeUnknown(rank, "failed")
        raise RequestTimedOut(entry.method, entry.timeout, entry.id)

    def remote_error(self, reply: Reply, rank: int, method: str) -> Exception:
        """The typed error of a failed ``reply``; an ``UnknownMethod`` one with the
        method names the engine listed in the reply's result (None when it sent
        none, or something else)."""
        info = reply.error or _NO_ERROR_INFO
        methods = None
        if info.type == "UnknownMethod" and len(reply.result):
            try:
                names = self.codec.decode_value(reply.result, list[str] | None)
            except PayloadTypeError:
                names = None
            methods = tuple(names) if names is not None else None
        return remote_error(info, rank=rank, method=method, methods=methods,
                            exceptions=self.exceptions)

    def decode_result(self, raw: msgspec.Raw, result_type: Any) -> Any:
        """``codec.decode_value(raw, result_type)``: a fresh object, or PayloadTypeError.

        Decodes with the codec's fast decoder for ``result_type`` (looked up once per
        type, no copy of ``raw``); anything it refuses (an empty ``raw`` included)
        goes through ``decode_value`` for the typed verdict."""
        try:
            decode = self._decoders[result_type]
        except KeyError:
            fast = self.codec.fast_value_codec(result_type)
            decode = self._decoders[result_type] = fast[1] if fast is not None else None
        except TypeError:  # an unhashable type
            decode = None
        if decode is not None:
            try:
                return decode(raw)
            except Exception:
                pass
        return self.codec.decode_value(raw, result_type)

    def fan_out_result(self, entry: PendingRequest, result_type: Any) -> FanOutResult:
        """A fresh FanOutResult (freshly decoded values) for one holder of ``entry``."""
        result = FanOutResult(entry.method, entry.id, entry.policy, entry.ranks)
        for rank, reply in entry.replies.items():
            if reply.ok:
                try:
                    result.results[rank] = self.decode_result(reply.result, result_type)
                except PayloadTypeError as exc:
                    result.errors[rank] = ResultTypeError(
                        f"{entry.method!r} result from rank {rank}: {exc}")
            else:
                result.errors[rank] = self.remote_error(reply, rank, entry.method)
        for rank, error in entry.errors.items():
            result.errors.setdefault(rank, error)
        result.pending = tuple(r for r in entry.ranks
                               if r not in result.results and r not in result.errors)
        return result

    def fan_out_outcome(self, entry: PendingRequest, result_type: Any) -> FanOutResult:
        result = self.fan_out_result(entry, result_type)
        if entry.state is _S.DONE:
            return result
        if entry.state is _S.FAILED:
            if self.closed() and any(type(e) is ClientClosed for e in entry.errors.values()):
                raise ClientClosed("client closed")  # close ends every call the same way
            raise FanOutFailed(entry.method, entry.policy.value, result)
        raise RequestTimedOut(entry.method, entry.timeout, entry.id, partial=result)
