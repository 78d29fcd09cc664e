"""One received request on the engine (:class:`InboundRequest`), the method it
names (:class:`MethodSpec`) and the answer to a frame that could not be decoded
(:class:`BadFrame`). A request's state moves only through :meth:`InboundRequest.go`
(:mod:`~ctlwire.kernel.core.inbound_core` makes every decision)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ctlwire.states import INBOUND_REQUEST_TABLE, InboundEvent, InboundState
from ctlwire.transports.envelope import Reply, Request
from ctlwire.transports.transport import Route

__all__ = ["BadFrame", "InboundRequest", "MethodSpec"]


@dataclass(frozen=True)
class MethodSpec:
    """A registered control method (built by the engine's method table)."""

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
    decode: Callable[[Any], Any] | None = field(default=None, repr=False, compare=False)
    """The codec's shortcut decoder for ``payload_type`` (None: the codec's
    ``decode_value``); whatever it refuses, ``decode_value`` judges."""
    encode: Callable[[Any], bytes] | None = field(default=None, repr=False, compare=False)
    """The codec's shortcut value encoder (None: ``encode_value``)."""
    control: bool = False
    """A sync handler that never blocks and must reach the engine whatever else waits
    (the ledger's take-over and abort): run as it arrives, never queued."""


# INBOUND_REQUEST_TABLE as one dict, read by InboundRequest.go:
# (state, event) -> state; a pair it lacks is an illegal move (go raises)
_MOVES: dict[tuple[InboundState, InboundEvent], InboundState] = {
    (state, event): to for (state, event), to in INBOUND_REQUEST_TABLE}


class InboundRequest(msgspec.Struct):
    """One received request: its route, when it was received, its state, and
    once admitted (Running) its method and handler arguments."""

    request: Request
    route: Route
    received: float
    state: InboundState = InboundState.RECEIVED
    spec: MethodSpec | None = None
    args: tuple[Any, ...] = ()
    #: its idempotency key is recorded as running (taken as it arrived, or as it started)
    key_held: bool = False
    #: the bytes of the frame it came in (what its undecoded payload keeps alive)
    size: int = 0

    def go(self, event: InboundEvent) -> InboundState:
        """Move through the table (the only way a request's state changes)."""
        try:
            to = self.state = _MOVES[self.state, event]
        except KeyError:
            INBOUND_REQUEST_TABLE.apply(self.state, event, self.request.id)  # IllegalTransition
            raise AssertionError("unreachable: the table refused the move") from None
        return to


@dataclass(frozen=True)
class BadFrame:
    """The error reply to a frame that could not be decoded but whose id was read."""

    route: Route
    reply: Reply
