"""Typed envelopes: the only things that cross a ctlwire socket.

Three kinds, as a msgspec tagged union encoded as compact arrays:

* :class:`Request` — API server to engine: id, rank, method, payload, deadline,
  sequence, the client's incarnation and an optional opaque trace context.
* :class:`Reply` — engine to API server: id, rank, the engine's incarnation, ok,
  and either a result or an :class:`ErrorInfo` (remote class name, message, code).
* :class:`Heartbeat` — either direction: who is alive, under which incarnation.

``payload`` and ``result`` are :class:`msgspec.Raw`: already encoded by the
codec, decoded only by whoever knows the expected type (the engine handler's
declared parameter type, the caller's result type). ``deadline`` is wall-clock
seconds since the epoch (0 means none); it lets an engine skip a request whose
caller has already given up. A timeout never cancels remote work: delivery is
at most once.
"""

from __future__ import annotations

import msgspec

__all__ = ["NO_DEADLINE", "Envelope", "ErrorInfo", "Heartbeat", "Reply", "Request"]

NO_DEADLINE = 0.0


class ErrorInfo(msgspec.Struct, frozen=True, array_like=True):
    """A remote failure: the exception's class name, its message and a code."""

    type: str
    message: str
    code: int = 0


class Request(msgspec.Struct, frozen=True, array_like=True, tag="q"):
    id: int
    rank: int
    method: str
    payload: msgspec.Raw
    deadline: float = NO_DEADLINE
    seq: int = 0
    client: int = 0
    trace: dict[str, str] | None = None


class Reply(msgspec.Struct, frozen=True, array_like=True, tag="r"):
    id: int
    rank: int
    incarnation: int
    ok: bool
    result: msgspec.Raw
    error: ErrorInfo | None = None


class Heartbeat(msgspec.Struct, frozen=True, array_like=True, tag="h"):
    rank: int
    incarnation: int
    seq: int = 0


Envelope = Request | Reply | Heartbeat
