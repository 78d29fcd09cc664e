"""The allow-list of an :class:`~ctlwire.kernel.engine_endpoint.EngineEndpoint`:
registering control methods, their :class:`MethodSpec`, the per-method codecs of
the fast path, and the ``code`` values of the endpoint's own errors."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_type_hints

from ctlwire.kernel.errors import FENCED_CODE
from ctlwire.transports.codec import Codec
from ctlwire.transports.protocol_version import UNSUPPORTED_VERSION_CODE

__all__ = ["NO_PAYLOAD", "ErrorCode", "FastMethod", "MethodRegistry", "MethodSpec"]

_NONE = object()
NO_PAYLOAD = _NONE
"""``payload_type`` not given (register), or no payload sent to an optional one (admission)."""


class ErrorCode:
    """``code`` values of the errors the endpoint itself produces."""

    UNKNOWN_METHOD = 404
    INVALID_PAYLOAD = 422
    DEADLINE_EXPIRED = 408
    MALFORMED_FRAME = 400
    OVERSIZED_FRAME = 413
    WRONG_RANK = 421
    RESULT_NOT_ENCODABLE = 500
    ASYNC_HANDLER_IN_POLL = 501
    FENCED = FENCED_CODE
    IN_PROGRESS = 425
    FENCE_OUT_OF_RANGE = 416
    KEY_TOO_LONG = 414
    CACHE_FULL = 507
    UNSUPPORTED_PROTOCOL_VERSION = UNSUPPORTED_VERSION_CODE


@dataclass(frozen=True)
class MethodSpec:
    """A registered control method."""

    name: str
    handler: Callable[..., Any]
    payload_type: Any
    takes_payload: bool
    is_async: bool
    threaded: bool
    payload_optional: bool = False
    concurrency: int = 1
    read_only: bool = False
    """Declared not to change the engine's state: fencing tokens and idempotency
    keys are ignored for it (it neither checks nor moves the fence)."""


FastMethod = tuple[MethodSpec, Callable[[Any], bytes], Callable[[Any], Any]]
"""A sync inline method whose payloads the codec can take on its hot path:
(spec, encode a result, decode a payload as the spec's type)."""


class MethodRegistry:
    """The allow-list part of an endpoint: registration and the method tables
    (set up by ``EngineEndpoint.__init__``)."""

    codec: Codec
    _methods: dict[str, MethodSpec]
    _fast: dict[str, FastMethod]
    _builtin: frozenset[str]
    #: the seam where a sync handler is placed: each new spec passes through it
    #: (:class:`~ctlwire.kernel.busy_loop.BusyLoop` hands state-changing ones to its loop)
    place_handler: Callable[[MethodSpec], MethodSpec] | None = None

    # -- registration ----------------------------------------------------------
    def register(self, name: str, handler: Callable[..., Any], *, payload_type: Any = _NONE,
                 threaded: bool = False, concurrency: int = 1, read_only: bool = False,
                 _caller_frame: int = 1) -> MethodSpec:
        """Allow ``name``, served by ``handler``.

        ``handler`` takes no argument or one (the payload, decoded as its
        annotation or ``payload_type``). Async handlers run in :meth:`serve`;
        sync ones run inline, or in a worker thread with ``threaded=True``.
        Under :meth:`serve`, async and threaded handlers of one method run at
        most ``concurrency`` at a time (default 1: serial, in arrival order),
        concurrently with other methods.

        ``read_only=True`` declares that the handler does not change the
        engine's state (a query): its requests neither check nor move the
        engine's fence and are never recorded under an idempotency key. Every
        other method is state-changing.

        The payload annotation is resolved here, string annotations
        (``from __future__ import annotations``) included, in the handler's
        module and then in the scope that registers it (a ``msgspec.Struct``
        defined in the same function works). An annotation that cannot be
        resolved raises TypeError now: validation is never silently turned off
        (pass ``payload_type=`` to say the type explicitly).
        """
        if not name or not isinstance(name, str):
            raise ValueError("method name must be a non-empty string")
        if name in self._methods:
            raise ValueError(f"method {name!r} is already registered")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency of {name!r} must be an int >= 1, not {concurrency!r}")
        params = [p for p in inspect.signature(handler).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = [p for p in params if p.default is p.empty]
        if len(required) > 1:
            raise TypeError(f"handler for {name!r} must take at most one argument (the payload)")
        takes_payload = bool(params)
        if payload_type is _NONE:
            payload_type = Any
            if takes_payload:
                payload_type = _payload_annotation(name, handler, params[0], _caller_frame)
        optional = bool(params) and params[0].default is not params[0].empty
        spec = MethodSpec(name, handler, payload_type, takes_payload,
                          inspect.iscoroutinefunction(handler), threaded, optional, concurrency,
                          read_only)
        if self.place_handler is not None:
            spec = self.place_handler(spec)
        self._methods[name] = spec
        if not (spec.is_async or spec.threaded):
            codec = self.codec.fast_value_codec(payload_type)
            if codec is not None:
                self._fast[name] = (spec, codec[0], codec[1])
        return spec

    def method(self, name: str | None = None, *, payload_type: Any = _NONE,
               threaded: bool = False, concurrency: int = 1, read_only: bool = False
               ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator form of :meth:`register` (name defaults to the function's)."""

        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.register(name or fn.__name__, fn, payload_type=payload_type, threaded=threaded,
                          concurrency=concurrency, read_only=read_only,
                          _caller_frame=2)  # the scope applying the decorator
            return fn

        return deco

    @property
    def methods(self) -> list[str]:
        """The methods registered on this endpoint (not the built-in ones)."""
        return sorted(m for m in self._methods if m not in self._builtin)

    @property
    def builtin_methods(self) -> list[str]:
        """Methods every endpoint serves: ``ctlwire.metrics`` (its :meth:`metrics`)."""
        return sorted(self._builtin)


def _payload_annotation(name: str, handler: Callable[..., Any], param: inspect.Parameter,
                        caller_frame: int) -> Any:
    """The resolved annotation of ``handler``'s payload parameter (Any if none).

    Tries ``get_type_hints`` (the handler's module), then the parameter's own
    string annotation evaluated with the registering scope's locals. Raises
    TypeError when neither resolves it."""
    annotation = param.annotation
    if annotation is inspect.Parameter.empty:
        return Any
    if not isinstance(annotation, str):
        return annotation
    try:
        return get_type_hints(handler).get(param.name, Any)
    except Exception:
        pass  # a local name: try the registering scope next
    frame = sys._getframe(caller_frame + 1)  # register's caller (or the decorator's)
    try:
        namespace = {**getattr(handler, "__globals__", {}), **frame.f_locals}
        return eval(annotation, namespace)  # an annotation the handler's author wrote
    except Exception as exc:
        raise TypeError(
            f"cannot resolve the payload annotation {annotation!r} of handler {name!r} "
            f"({exc}); define the type where the handler's module can see it, or pass "
            "payload_type=... explicitly") from None
    finally:
        del frame
