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

**Ranges.** Decoding enforces each field's range (``docs/protocol.md``,
Envelopes): a frame with a value outside it is malformed, like one with a value of
the wrong type. Ids are ``1 .. 2**64 - 1``; sequence numbers, counters and
incarnations are not negative; versions fit 16 bits; a deadline is 0 (none) or a
positive finite number; a rank is ``0 .. 999 999 999`` (``-1``: a client's
heartbeat); a heartbeat's ``busy_for`` is not negative and its ``progress`` at most
1 (negative: none). Constructing an envelope checks nothing: the encoder sends what
it is given.

**Bounded decoding.** Every field a peer can make large is bounded while it is
decoded, so no frame costs more than a walk over its bytes: a request's
``method`` has at most :data:`MAX_METHOD_CHARS` characters, its ``trace`` at most
:data:`MAX_TRACE_ENTRIES` entries (refused from the map's header, before any is
decoded) with keys and values of at most :data:`MAX_TRACE_KEY_CHARS` and
:data:`MAX_TRACE_VALUE_CHARS` characters; a frame beyond them is malformed.
``payload`` and ``result`` are skipped over, not decoded (linear in their bytes);
they are decoded later into the types a handler or caller declares, which bound
their own containers (``msgspec.Meta(max_length=...)``).
"""

from __future__ import annotations

import sys
from typing import Annotated

import msgspec

from ctlwire.transports.protocol_version import PROTOCOL_VERSION

__all__ = ["MAX_METHOD_CHARS", "MAX_RANK", "MAX_TRACE_ENTRIES", "MAX_TRACE_KEY_CHARS",
           "MAX_TRACE_VALUE_CHARS", "NO_DEADLINE", "Envelope", "ErrorInfo", "Heartbeat",
           "Reply", "Request"]

NO_DEADLINE = 0.0
#: the largest rank (an identity spells it in at most 9 decimal digits)
MAX_RANK = 999_999_999
#: a request's ``method``: at most this many characters
MAX_METHOD_CHARS = 256
#: a request's ``trace``: at most this many entries, keys and values at most this long
MAX_TRACE_ENTRIES = 16
MAX_TRACE_KEY_CHARS = 256
MAX_TRACE_VALUE_CHARS = 8192

_Id = Annotated[int, msgspec.Meta(ge=1)]  # 1 .. 2**64 - 1 (msgpack's largest integer)
_Count = Annotated[int, msgspec.Meta(ge=0)]
_Version = Annotated[int, msgspec.Meta(ge=0, le=0xFFFF)]
_Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=sys.float_info.max)]  # finite, not NaN
_EngineRank = Annotated[int, msgspec.Meta(ge=0, le=MAX_RANK)]
_SenderRank = Annotated[int, msgspec.Meta(ge=-1, le=MAX_RANK)]
_Progress = Annotated[float, msgspec.Meta(le=1.0)]  # negative: none; NaN refused
_Method = Annotated[str, msgspec.Meta(max_length=MAX_METHOD_CHARS)]
# checked from the map's header, before any entry is decoded
_Trace = Annotated[dict[Annotated[str, msgspec.Meta(max_length=MAX_TRACE_KEY_CHARS)],
                        Annotated[str, msgspec.Meta(max_length=MAX_TRACE_VALUE_CHARS)]],
                   msgspec.Meta(max_length=MAX_TRACE_ENTRIES)]


class ErrorInfo(msgspec.Struct, frozen=True, array_like=True):
    """A remote failure: the exception's class name, its message and a code."""

    type: str
    message: str
    code: int = 0


class Request(msgspec.Struct, frozen=True, array_like=True, tag="q"):
    id: _Id
    rank: int  # any: an engine refuses all but its own (WrongRank)
    method: _Method
    payload: msgspec.Raw
    deadline: _Seconds = NO_DEADLINE
    seq: _Count = 0
    client: int = 0  # a label: compared, never interpreted
    trace: _Trace | None = None
    key: str = ""
    fence: int = 0  # any: an engine refuses one out of its window (FenceOutOfRange)
    version: _Version = PROTOCOL_VERSION


class Reply(msgspec.Struct, frozen=True, array_like=True, tag="r"):
    id: _Id
    rank: _EngineRank
    incarnation: _Count
    ok: bool
    result: msgspec.Raw
    error: ErrorInfo | None = None


class Heartbeat(msgspec.Struct, frozen=True, array_like=True, tag="h"):
    rank: _SenderRank
    incarnation: _Count
    seq: _Count = 0
    busy: _Count = 0
    method: str = ""
    busy_for: _Seconds = 0.0
    loops: _Count = 0
    progress: _Progress = -1.0
    note: str = ""
    version: _Version = PROTOCOL_VERSION


Envelope = Request | Reply | Heartbeat
