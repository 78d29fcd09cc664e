"""The engine's method table: the allow-list of control methods, each with its
payload type (resolved at registration), and how it runs (``read_only``,
``threaded``, ``concurrency``).

Guarantees: only registered names are served (nothing is looked up by
``getattr``); a name is registered once; a payload annotation that cannot be
resolved is refused at registration, so validation is never silently off.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any, get_type_hints

from ctlwire.kernel.core.inbound_core import MethodSpec
from ctlwire.transports.codec import Codec

__all__ = ["NO_PAYLOAD", "MethodTable"]

NO_PAYLOAD: Any = object()
"""``payload_type`` not given: the handler's annotation says it."""
_NONE = NO_PAYLOAD


class MethodTable:
    """Registered methods; see the module docstring."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        #: name -> spec (what the inbound core looks requests up in; change it only
        #: through :meth:`register`)
        self.specs: dict[str, MethodSpec] = {}
        #: names every endpoint serves built in (set by the endpoint)
        self.builtin: frozenset[str] = frozenset()
        #: where a sync handler is placed: each new spec passes through it
        #: (:class:`~ctlwire.kernel.engine.busy_loop.BusyLoop` hands state-changing ones to its
        #: loop)
        self.place_handler: Callable[[MethodSpec], MethodSpec] | None = None

    # -- registration ----------------------------------------------------------
    def register(self, name: str, handler: Callable[..., Any], *, payload_type: Any = _NONE,
                 threaded: bool = False, concurrency: int = 1, read_only: bool = False,
                 control: bool = False, _caller_frame: int = 1) -> MethodSpec:
        """Allow ``name``, served by ``handler``.

        ``handler`` takes no argument or one (the payload, decoded as its
        annotation or ``payload_type``). Where it runs, under ``serve()``:

        * ``async def``, or sync with ``threaded=True`` (then in a worker thread):
          in its method's lane, at most ``concurrency`` at a time (default 1:
          serial, in arrival order), concurrently with other methods' lanes while
          the engine keeps receiving. A threaded handler shares its state with the
          event loop and other handlers across threads: lock it, or replace it whole.
        * sync (plain): on the receive loop, as it arrives. While it runs the
          engine receives nothing -- no ``InProgress``, no ``Busy``, no read-only
          built-in answered, no other method started -- and nothing else on the
          loop runs (a lane handler starts only after it): keep it quick, or make
          it ``threaded`` or async.

        ``poll()`` runs sync handlers only, one at a time on its caller's thread
        (``threaded`` changes nothing there); an async one is answered
        ``AsyncHandlerInPoll`` (501).

        ``read_only=True`` declares that the handler does not change the
        engine's state (a query): its requests neither check nor move the
        engine's fence and are never recorded under an idempotency key. Every
        other method is state-changing.

        ``control=True`` (with ``threaded=True``: the operation ledger's take-over
        and abort) declares a sync handler that never blocks (it holds the
        engine's state for a moment) and must reach the engine whatever else
        waits: under ``serve()`` it runs as it arrives, on the receive loop, never
        queued in a lane and never refused ``Busy``; a busy loop still serves it
        from a worker thread beside its steps.

        The payload annotation is resolved here, string annotations
        (``from __future__ import annotations``) included, in the handler's
        module and then in the scope that registers it (a ``msgspec.Struct``
        defined in the same function works). An annotation that cannot be
        resolved raises TypeError now: validation is never silently turned off
        (pass ``payload_type=`` to say the type explicitly).
        """
        if not name or not isinstance(name, str):
            raise ValueError("method name must be a non-empty string")
        if name in self.specs:
            raise ValueError(f"method {name!r} is already registered")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency of {name!r} must be an int >= 1, not {concurrency!r}")
        takes_payload, optional, payload_type = handler_payload(
            name, handler, payload_type, _caller_frame)
        is_async = inspect.iscoroutinefunction(handler)
        if control and is_async:
            raise TypeError(f"control method {name!r} must be a sync handler that never blocks")
        fast = self.codec.fast_value_codec(payload_type)
        spec = MethodSpec(name, handler, payload_type, takes_payload, is_async, threaded,
                          optional, concurrency, read_only, fast[1] if fast else None,
                          fast[0] if fast else None, control=control)
        if self.place_handler is not None:
            spec = self.place_handler(spec)
        self.specs[name] = spec
        return spec

    def method(self, name: str | None = None, *, payload_type: Any = _NONE,
               threaded: bool = False, concurrency: int = 1, read_only: bool = False
               ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator form of :meth:`register` (name defaults to the function's); where
        the handler runs (a lane, or the receive loop) is :meth:`register`'s."""

        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.register(name or fn.__name__, fn, payload_type=payload_type, threaded=threaded,
                          concurrency=concurrency, read_only=read_only,
                          _caller_frame=2)  # the scope applying the decorator
            return fn

        return deco

    @property
    def methods(self) -> list[str]:
        """The methods registered on this endpoint (not the built-in ones)."""
        return sorted(m for m in self.specs if m not in self.builtin)

    @property
    def builtin_methods(self) -> list[str]:
        """Methods every endpoint serves: ``ctlwire.metrics`` (its :meth:`metrics`)."""
        return sorted(self.builtin)


def handler_payload(name: str, handler: Callable[..., Any], payload_type: Any = _NONE,
                    caller_frame: int = 1) -> tuple[bool, bool, Any]:
    """How ``handler`` takes its payload, read once as it is registered: whether it
    takes one, whether it may be left out (its parameter has a default), and its type
    -- ``payload_type`` when given, else the parameter's resolved annotation (Any when
    it has none). ``caller_frame``: how many frames above the caller of this function
    the registering scope is (where a local annotation resolves). Raises TypeError
    when the handler requires more than one argument, or when its annotation cannot
    be resolved."""
    params = [p for p in inspect.signature(handler).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len([p for p in params if p.default is p.empty]) > 1:
        raise TypeError(f"handler for {name!r} must take at most one argument (the payload)")
    if not params:
        return False, False, Any if payload_type is _NONE else payload_type
    if payload_type is _NONE:
        payload_type = _payload_annotation(name, handler, params[0], caller_frame + 1)
    return True, params[0].default is not params[0].empty, payload_type


def _payload_annotation(name: str, handler: Callable[..., Any], param: inspect.Parameter,
                        caller_frame: int) -> Any:
    """The resolved annotation of ``handler``'s payload parameter (Any if none).

    Tries ``get_type_hints`` (the handler's module), then the parameter's own
    string annotation evaluated in the registering scope. Raises TypeError when
    neither resolves it."""
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
        return eval(annotation, frame.f_globals, frame.f_locals)  # as its author wrote it
    except Exception as exc:
        raise TypeError(
            f"cannot resolve the payload annotation {annotation!r} of handler {name!r} "
            f"({exc}); define the type where the handler's module can see it, or pass "
            "payload_type=... explicitly") from None
    finally:
        del frame
