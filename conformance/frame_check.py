"""The conformance harness's cases about frames (``docs/protocol.md``, Envelopes and
Limits): fields out of their ranges, integers at the limits of theirs, a ``-0.0``
deadline, a minor version's unknown fields, the decode bounds of a request's method
and trace map, and frames over the size limit that must be answered, not fatal.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from ctlwire.conformance.report import CODEC, Report
from ctlwire.conformance.wire import HarnessClient, float32_deadline, request_items
from ctlwire.transports.protocol_version import PROTOCOL_VERSION, pack_version

__all__ = ["FRAME_CASES", "check_frames"]

#: how far over the frame limit a frame still reaches the engine whole (below the
#: transport's cap: the limit + max(64 KiB, limit / 16))
_OVER_BY = 512 * 1024

#: every case of this module, in the order they run
FRAME_CASES: tuple[str, ...] = (
    "envelopes/negative-seq-malformed",
    "envelopes/version-beyond-16-bits-malformed",
    "envelopes/nan-deadline-malformed",
    "envelopes/float-for-integer-malformed",
    "envelopes/float32-deadline-accepted",
    "envelopes/fence-of-2-to-the-63-out-of-range",
    "envelopes/fence-of-2-to-the-64-minus-1-out-of-range",
    "envelopes/fence-of-minus-2-to-the-63-out-of-range",
    "envelopes/rank-of-2-to-the-64-minus-1-wrong-rank",
    "envelopes/rank-of-minus-2-to-the-63-wrong-rank",
    "envelopes/client-of-any-integer-served",
    "envelopes/seq-of-2-to-the-64-minus-1-served",
    "envelopes/negative-zero-deadline-is-none",
    "versioning/minor-version-unknown-fields-served",
    "limits/method-of-256-characters-decoded",
    "limits/method-of-257-characters-malformed",
    "limits/trace-at-its-bounds-served",
    "limits/trace-of-17-entries-malformed",
    "limits/trace-key-of-257-characters-malformed",
    "limits/trace-value-of-8193-characters-malformed",
    "limits/oversized-frame-answered-413",
    "error-codes/413-OversizedFrame",
    "limits/connection-survives-oversized-frame",
    "limits/frame-below-the-transport-cap-answered-413",
)


def check_frames(engine: HarnessClient, report: Report) -> None:
    """Every case of this module against ``engine``."""
    for case in (check_ranges, check_bounds, check_oversized):
        case(engine, report)


def check_ranges(engine: HarnessClient, report: Report) -> None:
    """A field out of its range is malformed (400, its id answered)."""
    for name, fields in (("envelopes/negative-seq-malformed", {"seq": -1}),
                         ("envelopes/version-beyond-16-bits-malformed",
                          {"version": 0x10000 | PROTOCOL_VERSION}),
                         ("envelopes/nan-deadline-malformed", {"deadline": float("nan")}),
                         ("envelopes/float-for-integer-malformed", {"fence": 2.0})):
        engine.expect_error(report, name, engine.call("echo", 1, **fields),
                          "MalformedFrame", 400)
    rid = engine.new_id()
    frame = float32_deadline(request_items(rid, engine.rank, "echo", "f32"),
                             time.time() + 600.0)
    reply = engine.call("echo", frame=frame, request_id=rid)
    report.add("envelopes/float32-deadline-accepted", reply is not None and reply.ok,
               repr(reply.error if reply else None))
    limits: list[tuple[str, str, dict[str, Any], tuple[str, int]]] = [
            ("envelopes/fence-of-2-to-the-63-out-of-range", "count", {"fence": 2**63},
             ("FenceOutOfRange", 416)),
            ("envelopes/fence-of-2-to-the-64-minus-1-out-of-range", "count",
             {"fence": 2**64 - 1}, ("FenceOutOfRange", 416)),
            ("envelopes/fence-of-minus-2-to-the-63-out-of-range", "count",
             {"fence": -(2**63)}, ("FenceOutOfRange", 416)),
            ("envelopes/rank-of-2-to-the-64-minus-1-wrong-rank", "echo",
             {"rank": 2**64 - 1}, ("WrongRank", 421)),
            ("envelopes/rank-of-minus-2-to-the-63-wrong-rank", "echo", {"rank": -(2**63)},
             ("WrongRank", 421))]
    for name, method, fields, (type_name, code) in limits:
        engine.expect_error(report, name, engine.call(method, **fields), type_name, code)
    served = [engine.call("echo", client, client=client)
              for client in (-1, 0, 2**64 - 1, -(2**63))]
    report.add("envelopes/client-of-any-integer-served", all(
        r is not None and r.ok for r in served), repr([r.error if r else None
                                                       for r in served]))
    reply = engine.call("echo", "last", seq=2**64 - 1)
    report.add("envelopes/seq-of-2-to-the-64-minus-1-served",
               reply is not None and reply.ok, repr(reply.error if reply else None))
    reply = engine.call("echo", "no deadline", deadline=-0.0)
    report.add("envelopes/negative-zero-deadline-is-none", reply is not None and reply.ok,
               repr(reply.error if reply else None))
    rid = engine.new_id()
    items = request_items(rid, engine.rank, "echo", "newer", version=pack_version(1, 9))
    reply = engine.call("echo", frame=msgspec.msgpack.encode(
        [*items, "a later field", {"x": 1}]), request_id=rid)
    report.add("versioning/minor-version-unknown-fields-served",
               reply is not None and reply.ok and CODEC.decode_value(reply.result) == "newer")


def check_bounds(engine: HarnessClient, report: Report) -> None:
    """A request's method and trace map are bounded while decoding: beyond a bound
    the frame is malformed (its id answered 400); at the bound it is decoded."""
    reply = engine.call("🚀" * 256)  # characters, not bytes: 1024 bytes of UTF-8
    engine.expect_error(report, "limits/method-of-256-characters-decoded", reply,
                      "UnknownMethod", 404)
    trace = {"k" * 256: "ü" * 8192, **{f"t{i}": "v" for i in range(15)}}
    reply = engine.call("echo", "traced", trace=trace)
    report.add("limits/trace-at-its-bounds-served", reply is not None and reply.ok,
               repr(reply.error if reply else None))
    beyond: list[tuple[str, str, dict[str, Any]]] = [
            ("limits/method-of-257-characters-malformed", "m" * 257, {}),
            ("limits/trace-of-17-entries-malformed", "echo",
             {"trace": {f"t{i}": "v" for i in range(17)}}),
            ("limits/trace-key-of-257-characters-malformed", "echo",
             {"trace": {"k" * 257: "v"}}),
            ("limits/trace-value-of-8193-characters-malformed", "echo",
             {"trace": {"traceparent": "v" * 8193}})]
    for name, method, fields in beyond:
        engine.expect_error(report, name, engine.call(method, 1, **fields), "MalformedFrame",
                          400)


def check_oversized(engine: HarnessClient, report: Report) -> None:
    """A frame over the limit (by 100 bytes: below libzmq's backstop) is answered."""
    rid = engine.new_id()
    head = msgspec.msgpack.encode(request_items(rid, engine.rank, "echo", ""))
    frame = msgspec.msgpack.encode(request_items(
        rid, engine.rank, "echo", "x" * (engine.limit + 100 - len(head))))
    reply = engine.call("echo", frame=frame, request_id=rid)
    report.add("limits/oversized-frame-answered-413", reply is not None and not reply.ok
               and reply.error is not None and reply.error.code == 413,
               f"{len(frame)} bytes: {reply.error if reply else 'no reply'}")
    engine.expect_error(report, "error-codes/413-OversizedFrame", reply, "OversizedFrame", 413)
    after = engine.call("echo", "still connected")
    report.add("limits/connection-survives-oversized-frame", after is not None and after.ok)
    rid = engine.new_id()
    frame = msgspec.msgpack.encode(request_items(
        rid, engine.rank, "echo", "x" * (engine.limit + _OVER_BY - len(head))))
    reply = engine.call("echo", frame=frame, request_id=rid)
    after = engine.call("echo", "still connected")
    report.add("limits/frame-below-the-transport-cap-answered-413",
               reply is not None and reply.error is not None and reply.error.code == 413
               and after is not None and after.ok,
               f"{len(frame)} bytes: {reply.error if reply else 'no reply'}; then "
               f"{'served' if after is not None and after.ok else 'nothing'}")
