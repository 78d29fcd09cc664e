"""Typed envelopes: the only things that cross a ctlwire socket.

Three kinds, as a msgspec tagged union encoded as compact arrays:

* :class:`Request` — API server to engine: id, rank, method, payload, deadline,
  sequence, the client's incarnation and an optional opaque trace context.
* :class:`Reply` — engine to API server: id, rank, the engine's incarnation, ok,
  and either a result or an :class:`ErrorInfo` (remote class name, message, code).
* :class:`Heartbeat` — either direction: who is alive, under which incarnation;
  an engine's also says what it is doing (progress), see below.

``payload`` and ``result`` are :class:`msgspec.Raw`: already encoded by the
codec, decoded only by whoever knows the expected type (the engine handler's
declared parameter type, the caller's result type). ``deadline`` is wall-clock
seconds since the epoch (0 means none); it lets an engine skip a request whose
caller has already given up. A timeout never cancels remote work: delivery is
at most once.

``Request.key`` is an idempotency key (empty: none): an engine that already ran
a request with the same key answers with the recorded result instead of running
it again. ``Request.fence`` is a fencing token (0: none): an engine refuses a
request whose token is lower than the highest it has already accepted.

An engine's heartbeat carries its progress: ``busy`` (the id of the request it
is running, 0 when idle), ``method``, ``busy_for`` (seconds the current request
or step has run without the engine's loop coming round, measured on the
engine's own clock), ``loops`` (loop iterations so far), and the running
handler's own ``progress`` (0..1, negative when unreported) and ``note``.
Fields added later have defaults, so older frames still decode.

``Request.version`` and ``Heartbeat.version`` announce the sender's protocol
version (:mod:`ctlwire.transports.protocol_version`); absent, it is 1.0. The
byte-level schema, field by field, is ``docs/protocol.md``.
"""

from __future__ import annotations

import msgspec

from ctlwire.transports.protocol_version import PROTOCOL_VERSION

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
    key: str = ""
    fence: int = 0
    version: int = PROTOCOL_VERSION


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
    busy: int = 0
    method: str = ""
    busy_for: float = 0.0
    loops: int = 0
    progress: float = -1.0
    note: str = ""
    version: int = PROTOCOL_VERSION


Envelope = Request | Reply | Heartbeat
