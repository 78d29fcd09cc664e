"""The typed outcomes a caller can see.

Every exception ctlwire raises on purpose is a :class:`CtlwireError`: the
client's failures below, the transports' errors
(:class:`~ctlwire.transports.errors.TransportError`), an operation's
(``InvalidPlan``, ``PostConditionFailed``, ``ReleaseRefused``) and the errors an
engine's built-in methods raise (which reach the client as :class:`RemoteError`
by their class name). An argument error is also a ``ValueError`` (or
``TypeError``); plain ``ValueError``/``TypeError`` mean a bad argument,
``RuntimeError`` a misuse (a client entered twice). Only a kernel bug raises
:class:`~ctlwire.states.IllegalTransition`, which is not one. Remote failures
keep the remote exception's class name, message and code; one whose class the
client allows (the builtins' by default) is also an instance of that class
(``RemoteValueError``: a ``RemoteError`` and a ``ValueError``).
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ctlwire.states import IllegalTransition
from ctlwire.transports.envelope import ErrorInfo
from ctlwire.transports.error_codes import ErrorCode
from ctlwire.transports.errors import CtlwireError

if TYPE_CHECKING:
    from ctlwire.kernel.core.fan_out_result import FanOutResult

__all__ = [
    "ActorStopped",
    "AskTimeout",
    "AuthenticationFailed",
    "Busy",
    "ClientClosed",
    "CtlwireError",
    "EngineDead",
    "FanOutFailed",
    "Fenced",
    "IllegalTransition",
    "InvalidPlan",
    "MailboxFull",
    "NoAdmissibleRanks",
    "NotDelivered",
    "OutcomeUnknown",
    "PostConditionFailed",
    "RankLeftOut",
    "ReleaseRefused",
    "RemoteError",
    "RequestTimedOut",
    "RequestTooLarge",
    "ResultTypeError",
    "UnknownMethod",
    "UnsupportedProtocolVersion",
    "allowed_exceptions",
    "error_info",
    "remote_error",
    "remote_error_class",
]


class RequestTimedOut(CtlwireError):
    """No outcome before the deadline. The remote work is not cancelled: a
    request is delivered at most once and may still run; its late reply is
    dropped and counted. ``partial`` holds what had arrived (fan-out).

    ``admission=True`` (``request_id`` 0): the caller was still queued in a
    fan-out mailbox at its deadline; no request was registered and nothing
    was sent, so a retry is safe."""

    def __init__(self, method: str, timeout: float, request_id: int = 0,
                 partial: FanOutResult | None = None, *, admission: bool = False) -> None:
        self.method = method
        self.timeout = timeout
        self.request_id = request_id
        self.partial = partial
        self.admission = admission
        if admission:
            text = (f"timed out waiting for admission to {method!r} after {timeout:g} s "
                    "(queued behind other callers; nothing was sent)")
        elif request_id:
            text = f"{method!r} got no outcome within {timeout:g} s (request {request_id})"
        else:
            text = f"{method!r} got no outcome within {timeout:g} s"
        super().__init__(text)


class RequestTooLarge(CtlwireError, ValueError):
    """The request's whole envelope (method name, payload, header) would exceed
    the codec's ``max_message_size``. Raised by the call before anything is
    registered or sent (a ``ValueError`` too, for callers that caught the
    earlier untyped error)."""

    def __init__(self, method: str, size: int, limit: int) -> None:
        self.method = method
        self.size = size
        self.limit = limit
        shown = method if len(method) <= 64 else method[:61] + "..."
        super().__init__(f"request {shown!r} of at least {size} bytes exceeds the maximum "
                         f"message size of {limit}")


class RemoteError(CtlwireError):
    """The engine answered with an error: its class name, message and code.

    An error whose class the client allows (``ControlClient(remote_exceptions=)``,
    the builtins' by default) is raised as a class derived from both this one and
    that class (``RemoteValueError``): ``except ValueError`` catches it, and so
    does ``except RemoteError``."""

    def __init__(self, type_name: str, message: str, code: int = 0, *, rank: int | None = None,
                 method: str = "") -> None:
        self.type_name = type_name
        self.message = message
        self.code = code
        self.rank = rank
        self.method = method
        where = f" from rank {rank}" if rank is not None else ""
        super().__init__(f"{type_name}: {message} (code {code}{where})")


class UnknownMethod(RemoteError):
    """The engine serves no method of that name (code 404); the request did not run.

    ``methods``: the names the engine serves, when it sent them (a ctlwire
    engine does), else None."""

    def __init__(self, type_name: str, message: str, code: int = 0, *,
                 rank: int | None = None, method: str = "",
                 methods: tuple[str, ...] | None = None) -> None:
        self.methods = methods
        super().__init__(type_name, message, code, rank=rank, method=method)


class EngineDead(CtlwireError):
    """The engine for ``rank`` is gone (lost, disconnected, unreachable).

    Raised as one of its two subclasses, which say whether the work ran:
    :class:`NotDelivered` (it certainly did not: a retry is safe) and
    :class:`OutcomeUnknown` (it may have run: retry only with an idempotency
    key). ``except EngineDead`` catches both."""

    retry_safe: bool = False

    def __init__(self, rank: int, detail: str = "") -> None:
        self.rank = rank
        self.detail = detail
        super().__init__(f"engine rank {rank} is dead" + (f": {detail}" if detail else ""))


class NotDelivered(EngineDead):
    """The request certainly did not reach the engine: it was never handed to
    the transport (the rank was already lost, unroutable, or refused the
    connection). The engine cannot run it. **A retry is safe.**"""

    retry_safe = True


class AuthenticationFailed(NotDelivered):
    """The engine refused this client's CURVE key (not in its authenticator's
    allow-list): nothing was delivered, and nothing will be until the key is
    allowed. Counted in ``ControlClient.metrics()["auth_failures"]`` and, on an
    engine that binds, ``EngineEndpoint.metrics()["auth_rejections"]``."""


class UnsupportedProtocolVersion(NotDelivered):
    """This client and the engine for ``rank`` speak different protocol major
    versions (``docs/protocol.md``, Versioning): either the engine's heartbeats
    announced one this client does not speak (nothing was sent), or the engine
    refused the request's version (code 505; it did not run). Nothing will be
    delivered until one side is upgraded. Refused heartbeats are counted in
    ``ControlClient.metrics()`` as ``dropped_protocol_version``."""

    code = ErrorCode.UNSUPPORTED_PROTOCOL_VERSION


class OutcomeUnknown(EngineDead):
    """The request was handed to the transport, then the rank was lost or
    restarted before it answered: the engine may have run it, may be running
    it, or may never have received it. **A retry is safe only with an
    idempotency key** (the engine then answers with the first run's result)."""

    retry_safe = False


class FanOutFailed(CtlwireError):
    """A fan-out's policy could not be met; ``result`` has every rank's outcome."""

    def __init__(self, method: str, policy: str, result: FanOutResult) -> None:
        self.method = method
        self.policy = policy
        self.result = result
        errs = ", ".join(f"{r}: {type(e).__name__}" for r, e in sorted(result.errors.items()))
        super().__init__(f"{method!r} fan-out could not meet policy {policy!r} ({errs})")


class NoAdmissibleRanks(CtlwireError):
    """A fan-out without explicit ranks found no admissible rank; nothing was
    registered or sent. ``left_out`` maps each present rank to why it is not
    admissible."""

    def __init__(self, method: str, left_out: dict[int, str]) -> None:
        self.method = method
        self.left_out = dict(left_out)
        super().__init__(f"{method!r}: no admissible rank to send to (left out: "
                         f"{self.left_out})")


class RankLeftOut(CtlwireError):
    """A fan-out or operation without explicit ranks did not address ``rank``:
    it is present but not admissible. ``reason`` is one of ``"not admitted"``,
    ``"quarantined"``, ``"admission condition not met"``. Nothing was sent to it;
    it counts against the result's ``ok`` unless the caller asked for the
    admissible ranks only."""

    def __init__(self, rank: int, reason: str) -> None:
        self.rank = rank
        self.reason = reason
        super().__init__(f"rank {rank} left out: {reason}")


class Fenced(RemoteError):
    """The engine refused the request: its fencing token is older than one the
    engine has already accepted (a newer controller or operation took over).
    The request did not run."""


class Busy(RemoteError):
    """The engine had no room to queue the request (its method's queue, this
    client's share of the waiting requests, or their byte budget is full: code
    429) and refused it at once. The request did not run: **a retry later is
    safe**."""

    retry_safe = True


class ResultTypeError(CtlwireError):
    """A result did not match the ``result_type`` the caller asked for (the
    engine answered; its answer had another shape). Also importable as
    ``ctlwire.kernel.client.control_client.ResultTypeError`` (the same class)."""


class ClientClosed(CtlwireError):
    """The client was closed while the call was pending."""


class ActorStopped(CtlwireError):
    """The actor stopped before it handled the message."""


class MailboxFull(CtlwireError):
    """``tell_nowait`` found the actor's mailbox full (also importable as
    ``ctlwire.kernel.actor.MailboxFull``)."""


class AskTimeout(CtlwireError):
    """An actor did not answer an ``ask`` in time."""


class InvalidPlan(CtlwireError, ValueError):
    """A plan that cannot run as declared, found before anything is sent.

    ``problems`` lists every one found (a step, what is wrong with it)."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


class PostConditionFailed(CtlwireError):
    """A rank's answer to a plan's post-condition does not match what it expects."""

    def __init__(self, rank: int, method: str, expected: Mapping[str, Any],
                 observed: Any) -> None:
        self.rank, self.method, self.expected, self.observed = rank, method, expected, observed
        super().__init__(f"rank {rank}: {method} answered {observed!r}, "
                         f"expected {dict(expected)!r}")


class ReleaseRefused(CtlwireError):
    """A quarantined rank that does not meet its post-condition: it stays quarantined.
    ``observed``: what the rank answered (or the error reading it)."""

    def __init__(self, rank: int, reason: str, observed: Any = None) -> None:
        self.rank, self.reason, self.observed = rank, reason, observed
        super().__init__(f"rank {rank} stays quarantined: {reason} (release(force=True) "
                         "to override)")


# raising them on a client would change its control flow (a generator's end, an iterator's)
_NOT_RAISED = frozenset({"StopIteration", "StopAsyncIteration"})

BUILTIN_EXCEPTIONS: Mapping[str, type[Exception]] = MappingProxyType({
    name: value for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, Exception) and name not in _NOT_RAISED})
"""The builtins' exception classes (``Exception`` and below, but ``StopIteration`` and
``StopAsyncIteration``) by name: those a client raises as themselves by default."""


def allowed_exceptions(classes: Iterable[type[Exception]] | None = None
                       ) -> Mapping[str, type[Exception]]:
    """The exception classes an engine's error may be raised as on the client, by
    the class name its reply carries (``ErrorInfo.type``): the builtins' for None
    (:data:`BUILTIN_EXCEPTIONS`), else ``classes`` (empty: none). TypeError for
    something that is not an ``Exception`` subclass."""
    if classes is None:
        return BUILTIN_EXCEPTIONS
    allowed: dict[str, type[Exception]] = {}
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            raise TypeError(f"{cls!r} is not an Exception subclass")
        allowed[cls.__name__] = cls
    return MappingProxyType(allowed)


_REMOTE_CLASSES: dict[type[Exception], type[RemoteError] | None] = {}
_REMOTE_CLASSES_LOCK = threading.Lock()


def remote_error_class(cls: type[Exception]) -> type[RemoteError] | None:
    """One class derived from both :class:`RemoteError` and ``cls`` (``RemoteValueError``
    for ``ValueError``): an ``except ValueError`` and an ``except RemoteError`` both
    catch it. Made once per class; None when the two cannot be combined (a class
    whose constructor needs other arguments, like ``UnicodeDecodeError``)."""
    try:
        return _REMOTE_CLASSES[cls]
    except KeyError:
        pass
    with _REMOTE_CLASSES_LOCK:
        if cls in _REMOTE_CLASSES:
            return _REMOTE_CLASSES[cls]
        derived: type[RemoteError] | None
        try:
            derived = type(f"Remote{cls.__name__}", (RemoteError, cls), {
                "__module__": __name__, "__str__": BaseException.__str__,
                "__doc__": f"An engine's {cls.__name__}: a RemoteError and a {cls.__name__}."})
            derived("probe", "")  # its constructor takes RemoteError's arguments
        except Exception:
            derived = None
        _REMOTE_CLASSES[cls] = derived
        return derived


def remote_error(info: ErrorInfo, *, rank: int | None = None, method: str = "",
                 methods: tuple[str, ...] | None = None,
                 exceptions: Mapping[str, type[Exception]] = BUILTIN_EXCEPTIONS,
                 ) -> RemoteError | UnsupportedProtocolVersion:
    """The typed error of an engine's error reply (``methods``: the names an
    ``UnknownMethod`` reply listed). ctlwire's own refusals first (``Fenced``,
    ``Busy``, ``UnknownMethod``, ``UnsupportedProtocolVersion``); then a class named
    in ``exceptions`` (by default the builtins') is raised as that class, still a
    RemoteError (:func:`remote_error_class`); any other is a RemoteError with the
    class name in ``type_name``."""
    if info.code == UnsupportedProtocolVersion.code and info.type == "UnsupportedProtocolVersion":
        return UnsupportedProtocolVersion(rank if rank is not None else -1, info.message)
    if info.code == ErrorCode.UNKNOWN_METHOD and info.type == "UnknownMethod":
        return UnknownMethod(info.type, info.message, info.code, rank=rank, method=method,
                             methods=methods)
    cls: type[RemoteError] = RemoteError
    if info.code == ErrorCode.FENCED and info.type == "Fenced":
        cls = Fenced
    elif info.code == ErrorCode.BUSY and info.type == "Busy":
        cls = Busy
    else:
        allowed = exceptions.get(info.type)
        derived = remote_error_class(allowed) if allowed is not None else None
        if derived is not None:
            cls = derived
    return cls(info.type, info.message, info.code, rank=rank, method=method)


def error_info(exc: BaseException) -> ErrorInfo:
    """What an engine sends back for ``exc``: class name, message, ``code`` attribute."""
    code: Any = getattr(exc, "code", 0)
    return ErrorInfo(type(exc).__name__, str(exc), code if isinstance(code, int) else 0)
