"""The conformance vectors of ``protocol/vectors/``: what each one means, and the
conversions between envelopes and their JSON meaning.

``python tests/protocol/protocol_vector_cases.py`` (re)writes the vector files
from the cases below with this implementation's encoder; the vectors test then
holds the encoder to those bytes. Rewrite them only for a deliberate change of
the wire format (and a new protocol version).

A vector file is one JSON object:

* ``name``, ``description``;
* ``expect``: ``"roundtrip"`` (encoding ``meaning`` gives exactly ``hex``, decoding
  ``hex`` gives exactly ``meaning``), ``"decode"`` (decoding ``hex`` gives ``meaning``;
  encoders write ``canonical_hex`` instead: unknown trailing fields, absent optional
  ones, an integer where a float is expected) or ``"reject"`` (``hex`` is not an
  envelope: a receiver refuses it; ``salvaged_id`` is the request id it can still
  answer, 0 for none);
* ``hex``: the frame's bytes;
* ``meaning``: ``{"kind": "request" | "reply" | "heartbeat" | "value", "fields": {...}}``.
  Embedded values (``payload``, ``result``) appear twice: ``<name>_hex`` (the exact
  bytes) and ``<name>`` (their msgpack value as JSON). ``value`` vectors are a
  payload or result alone (an operation step, the ledger's answer).
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import msgspec

from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.envelope import Envelope, ErrorInfo, Heartbeat, Reply, Request

VECTORS = Path(__file__).resolve().parents[2] / "protocol" / "vectors"
CODEC = MsgpackCodec()
NIL = msgspec.Raw(b"\xc0")
KINDS = {"request": Request, "reply": Reply, "heartbeat": Heartbeat}
RAW_FIELDS = ("payload", "result")

# fixed, plausible values (an incarnation minted 2026-01-01T00:00:00Z, a fence of then)
ENGINE_INC = (1_767_225_600_000 << 12) | 0x5A5
CLIENT_INC = (1 << 30) | 0x2F1C3
REQ_ID = (CLIENT_INC << 32) | 1
WALL = 1_767_225_600.25
FENCE = 1_767_225_600_000_000


def raw(value: Any) -> msgspec.Raw:
    return CODEC.encode_value(value)


def meaning_of(env: Envelope) -> dict[str, Any]:
    """An envelope as its JSON meaning."""
    kind = {Request: "request", Reply: "reply", Heartbeat: "heartbeat"}[type(env)]
    fields: dict[str, Any] = {}
    for name in env.__struct_fields__:
        value = getattr(env, name)
        if isinstance(value, msgspec.Raw):
            fields[name + "_hex"] = bytes(value).hex()
            fields[name] = msgspec.msgpack.decode(bytes(value)) if len(value) else None
        elif isinstance(value, ErrorInfo):
            fields[name] = {"type": value.type, "message": value.message, "code": value.code}
        else:
            fields[name] = value
    return {"kind": kind, "fields": fields}


def envelope_of(meaning: dict[str, Any]) -> Envelope:
    """The envelope a JSON meaning describes (embedded values from their exact bytes)."""
    cls = KINDS[meaning["kind"]]
    fields = dict(meaning["fields"])
    for name in RAW_FIELDS:
        if name + "_hex" in fields:
            fields[name] = msgspec.Raw(bytes.fromhex(fields.pop(name + "_hex")))
    if isinstance(fields.get("error"), dict):
        fields["error"] = ErrorInfo(**fields["error"])
    env: Envelope = cls(**fields)
    return env


def _roundtrip(name: str, description: str, env: Envelope) -> dict[str, Any]:
    return {"name": name, "description": description, "expect": "roundtrip",
            "hex": CODEC.encode(env).hex(), "meaning": meaning_of(env)}


def _decode_only(name: str, description: str, frame: bytes) -> dict[str, Any]:
    env = CODEC.decode(frame)
    return {"name": name, "description": description, "expect": "decode", "hex": frame.hex(),
            "canonical_hex": CODEC.encode(env).hex(), "meaning": meaning_of(env)}


def _reject(name: str, description: str, frame: bytes) -> dict[str, Any]:
    return {"name": name, "description": description, "expect": "reject", "hex": frame.hex(),
            "salvaged_id": CODEC.salvage_id(frame)}


def _value(name: str, description: str, value: Any, struct: str = "") -> dict[str, Any]:
    """A payload or result alone; ``struct``: the ledger's type it is (by field name)."""
    data = msgspec.msgpack.encode(value)
    vector = {"name": name, "description": description, "expect": "roundtrip",
              "hex": data.hex(), "meaning": {"kind": "value", "fields":
                                             msgspec.msgpack.decode(data)}}
    if struct:
        vector["meaning"]["struct"] = struct
    return vector


def _fields(env: Envelope) -> list[Any]:
    return [getattr(env, f) for f in env.__struct_fields__]


def _frame(tag: str, *items: Any) -> bytes:
    return msgspec.msgpack.encode([tag, *items])


def _error(rid: int, type_name: str, message: str, code: int) -> Reply:
    return Reply(rid, 0, ENGINE_INC, False, NIL, ErrorInfo(type_name, message, code))


#: (type, code, message) of every error an engine answers with (docs/protocol.md)
ERRORS: list[tuple[str, int, str]] = [
    ("MalformedFrame", 400,
     "not a ctlwire envelope (msgpack): Expected `str`, got `int` - at `$[3]`"),
    ("UnknownMethod", 404, "no control method 'nope' on this engine"),
    ("UnknownStepMethod", 404, "'reload' is not an operation step on this engine"),
    ("DeadlineExpired", 408, "'load' arrived 0.250 s after its deadline"),
    ("Fenced", 409, "'load': fencing token 1767225600000000 is older than 1767225601000000, "
                    "already accepted"),
    ("OperationOwned", 403, "operation 'op-7' belongs to the controller that began it "
                            "(fence 1767225600000000); a successor takes it over with a newer "
                            "fence"),
    ("StepInFlight", 409, "step 'load' is running on rank 0; ask again once it returned"),
    ("StepNotApplied", 412, "operation 'op-7': step 'load' was not applied on rank 0; "
                            "nothing to undo"),
    ("OperationAborted", 410, "operation 'op-7' was compensated on rank 0; its forward steps "
                              "are refused"),
    ("OversizedFrame", 413, "frame of 16777300 bytes exceeds the maximum message size of "
                            "16777216"),
    ("ReplyTooLarge", 413, "frame of 16777300 bytes exceeds the maximum message size of "
                           "16777216"),
    ("KeyTooLong", 414, "'load': an idempotency key is at most 256 bytes"),
    ("FenceOutOfRange", 416, "'load': fencing token 9223372036854775807 is outside "
                             "1..1767225900000000"),
    ("WrongRank", 421, "this is rank 0, not 3"),
    ("InvalidPayload", 422, "'load': Expected `object`, got `str`"),
    ("InvalidStep", 422, "'update_weights': Expected `object`, got `int`"),
    ("StepOutOfOrder", 425, "operation 'op-7': step 'resume' (position 3) after ['pause'] on "
                            "rank 0"),
    ("InProgress", 425, "'load': a request with this idempotency key is still running"),
    ("ResultNotEncodable", 500, "'load': cannot encode int: can't serialize ints < -2**63 "
                                "or > 2**64 - 1"),
    ("AsyncHandlerInPoll", 501, "'load' is async: serve() runs it, poll() cannot"),
    ("UnsupportedProtocolVersion", 505, "this engine speaks protocol 1.0, the request 2.0"),
    ("CacheFull", 507, "'load': the idempotency cache is full of keys inside their retry "
                       "window"),
    ("ValueError", 0, "a handler's own exception: its class name, message and code attribute"),
]


def cases() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    add = out.append
    # -- requests -------------------------------------------------------------------
    add(_roundtrip("request-minimal", "A request with every optional field at its default.",
                   Request(1, 0, "ping", NIL)))
    add(_roundtrip("request-full", "Every field set: deadline, sequence, client incarnation, "
                   "trace context, idempotency key, fencing token.",
                   Request(REQ_ID, 3, "update_weights", raw({"path": "/w/step-7", "step": 7}),
                           WALL, 12, CLIENT_INC, {"traceparent":
                           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
                           "op-1:load", FENCE)))
    add(_roundtrip("request-fan-out-rank-7", "One rank's copy of a fan-out: same id, its own "
                   "rank and per-rank sequence.",
                   Request(REQ_ID + 1, 7, "pause", NIL, WALL, 3, CLIENT_INC)))
    add(_roundtrip("request-unicode-method", "A method name and payload outside ASCII "
                   "(UTF-8 on the wire).",
                   Request(2, 0, "重みを更新_ü_🚀", raw(["ß", 1.5, None, True]))))
    add(_roundtrip("request-max-key", "An idempotency key of 256 bytes, the default maximum "
                   "an engine accepts.", Request(3, 0, "load", raw(1), key="k" * 256)))
    add(_roundtrip("request-largest-id", "The largest id (2**64 - 1) and a negative rank "
                   "field value an engine refuses as WrongRank.",
                   Request(2**64 - 1, -1, "ping", NIL)))
    add(_roundtrip("request-metrics", "The built-in read-only method every engine serves.",
                   Request(4, 0, "ctlwire.metrics", NIL)))
    add(_roundtrip("request-step", "An operation step: method ctlwire.step, payload a "
                   "StepRequest map.",
                   Request(5, 0, "ctlwire.step", raw({
                       "op": "op-7", "step": "load", "phase": "apply", "fence": FENCE,
                       "key": "op-7:load", "method": "update_weights",
                       "args": CODEC.encode_value({"path": "/w"}), "index": 1,
                       "ranks": [0, 1]}),
                       WALL, 1, CLIENT_INC, None, "op-7:load", FENCE)))
    add(_roundtrip("request-last-operation", "The ledger's recovery query.",
                   Request(6, 0, "ctlwire.last_operation", NIL)))
    add(_roundtrip("request-major-2", "A request of protocol 2.0: an engine of 1.x refuses it "
                   "(UnsupportedProtocolVersion, 505).",
                   Request(7, 0, "ping", NIL, version=0x0200)))
    full = Request(8, 0, "ping", NIL, version=0x0103)
    add(_decode_only("request-minor-unknown-fields", "A request of protocol 1.3 with two "
                     "trailing fields this version does not know: ignored.",
                     _frame("q", *_fields(full)[:-1], full.version, "future", {"x": [1]})))
    add(_decode_only("request-old-frame", "A request of the first four fields only (an "
                     "older sender): the rest take their defaults (version 1.0).",
                     _frame("q", 9, 0, "ping", None)))
    add(_decode_only("request-integer-deadline", "A deadline written as an integer: "
                     "accepted where a float is expected.",
                     _frame("q", 10, 0, "ping", None, 1_767_225_600, 0, 0, None, "", 0, 256)))
    add(_decode_only("request-float32-deadline", "A deadline written as a float32 (0xca): "
                     "accepted, its value widened; an encoder writes float64.",
                     _frame("q", 10, 0, "ping", None, 0.0, 0, 0, None, "", 0, 256).replace(
                         b"\xcb" + bytes(8), b"\xca" + struct.pack(">f", 1_767_225_600.0))))
    add(_roundtrip("request-id-64-bits", "An id of 2**63: beyond a signed 64-bit integer, "
                   "a uint64 on the wire.", Request(2**63, 0, "ping", NIL)))
    add(_roundtrip("request-integers-largest", "rank, seq, client and fence at 2**64 - 1, the "
                   "largest MessagePack integer: it decodes; an engine refuses the rank "
                   "(WrongRank) and the fence (FenceOutOfRange), and only compares the "
                   "client.", Request(20, 2**64 - 1, "ping", NIL, seq=2**64 - 1,
                                      client=2**64 - 1, fence=2**64 - 1)))
    add(_roundtrip("request-integers-most-negative", "rank, client and fence at -2**63, "
                   "the most negative MessagePack integer: it decodes; an engine refuses the "
                   "rank (WrongRank) and the fence (FenceOutOfRange), and only compares the "
                   "client.", Request(21, -(2**63), "ping", NIL, client=-(2**63),
                                      fence=-(2**63))))
    add(_roundtrip("request-client-outside-its-range", "A client field a client must not "
                   "send (clients send 2**30 <= client < 2**31): a receiver accepts any "
                   "integer and only compares it.", Request(22, 0, "ping", NIL, client=-1)))
    negative_zero = _frame("q", 23, 0, "ping", None, -0.0)
    vector = _decode_only("request-negative-zero-deadline", "A deadline of -0.0: equal to "
                          "0, no deadline; an encoder writes 0.0.", negative_zero)
    vector["meaning"]["fields"]["deadline"] = 0.0
    vector["canonical_hex"] = CODEC.encode(Request(23, 0, "ping", NIL)).hex()
    add(vector)
    add(_roundtrip("request-method-longest", "A method of 256 characters, the most a "
                   "request may name (characters, not bytes: 1024 bytes of UTF-8 here).",
                   Request(24, 0, "🚀" * 256, NIL)))
    add(_roundtrip("request-trace-largest", "A trace map of 16 entries, the most a request "
                   "may carry, with a key of 256 characters and a value of 8192 characters.",
                   Request(25, 0, "ping", NIL, trace={
                       "k" * 256: "ü" * 8192, **{f"t{i}": "v" for i in range(15)}})))
    # -- replies --------------------------------------------------------------------
    add(_roundtrip("reply-ok", "A successful reply: the engine's incarnation and a result.",
                   Reply(REQ_ID, 3, ENGINE_INC, True, raw({"loaded": True, "bytes": 12345}))))
    add(_roundtrip("reply-ok-nil", "A successful reply whose result is nil.",
                   Reply(11, 0, ENGINE_INC, True, NIL)))
    add(_roundtrip("reply-last-operation", "The ledger's answer (a LastOperation map).",
                   Reply(6, 0, ENGINE_INC, True, raw({
                       "rank": 0, "op": "op-7", "step": "load", "phase": "apply",
                       "fence": FENCE, "applied": ["pause", "load"],
                       "highest_fence": FENCE, "steps": ["pause", "load"], "undone": [],
                       "ranks": [0, 1]}))))
    for type_name, code, message in ERRORS:
        add(_roundtrip(f"reply-error-{code}-{type_name}",
                       f"An error reply: {type_name} (code {code}).",
                       _error(12, type_name, message, code)))
    add(_roundtrip("reply-error-404-UnknownMethod-methods", "UnknownMethod (code 404) whose "
                   "result lists the methods the engine serves.",
                   Reply(12, 0, ENGINE_INC, False, raw(["ctlwire.metrics", "pause", "resume"]),
                         ErrorInfo("UnknownMethod", "no control method 'nope' on this engine",
                                   404))))
    add(_roundtrip("reply-error-salvaged-id", "The answer to a malformed request whose id "
                   "could be read.", _error(9, "MalformedFrame", "not a ctlwire envelope "
                                            "(msgpack): Object missing required field "
                                            "`payload`", 400)))
    add(_decode_only("reply-error-without-code", "An ErrorInfo of two elements: code 0.",
                     _frame("r", 13, 0, ENGINE_INC, False, None, ["RuntimeError", "boom"])))
    add(_decode_only("reply-error-extra-elements", "An ErrorInfo with elements after its "
                     "code (a newer minor version's): ignored, like an envelope's.",
                     _frame("r", 13, 0, ENGINE_INC, False, None,
                            ["RuntimeError", "boom", 7, "later", {"x": 1}])))
    add(_roundtrip("reply-error-code-largest", "An error code of 2**64 - 1: any MessagePack "
                   "integer is a code.", _error(14, "Odd", "a code beyond the table", 2**64 - 1)))
    add(_roundtrip("reply-error-code-most-negative", "An error code of -2**63: any "
                   "MessagePack integer is a code.",
                   _error(15, "Odd", "a code below the table", -(2**63))))
    add(_roundtrip("reply-incarnation-largest", "An engine incarnation of 2**64 - 1, the "
                   "largest: it decodes (a client then judges whether it is plausible).",
                   Reply(16, 0, 2**64 - 1, True, NIL)))
    # -- heartbeats -----------------------------------------------------------------
    add(_roundtrip("heartbeat-engine-idle", "An idle engine's heartbeat.",
                   Heartbeat(0, ENGINE_INC, 5, 0, "", 0.0, 100)))
    add(_roundtrip("heartbeat-engine-busy-private", "A busy engine's heartbeat to the "
                   "request's own sender: its id and the handler's progress.",
                   Heartbeat(0, ENGINE_INC, 6, REQ_ID, "update_weights", 2.5, 101, 0.375,
                             "shard 3/8")))
    add(_roundtrip("heartbeat-engine-busy-shared", "A busy engine's heartbeat that reaches "
                   "every peer: busy 0, method and seconds, no progress.",
                   Heartbeat(0, ENGINE_INC, 7, 0, "update_weights", 2.75, 101)))
    add(_roundtrip("heartbeat-engine-step", "An engine inside its own step (not polled for "
                   "two intervals).", Heartbeat(1, ENGINE_INC, 8, 0, "(step)", 4.0, 102)))
    add(_roundtrip("heartbeat-max-note", "A progress note of 200 characters, the most an "
                   "engine sends.", Heartbeat(0, ENGINE_INC, 9, REQ_ID, "load", 1.0, 1, 0.5,
                                               "é" * 200)))
    add(_roundtrip("heartbeat-client", "A client's heartbeat: rank -1, the client's "
                   "incarnation.", Heartbeat(-1, CLIENT_INC, 42)))
    add(_roundtrip("heartbeat-hello", "A client's first-contact hello and connection probe.",
                   Heartbeat(-1, 0, 0)))
    add(_roundtrip("heartbeat-major-2", "An engine of protocol 2.0: a client of 1.x refuses "
                   "it.", Heartbeat(0, ENGINE_INC, 1, version=0x0200)))
    hb = Heartbeat(0, ENGINE_INC, 2, version=0x0107)
    add(_decode_only("heartbeat-minor-unknown-fields", "A heartbeat of protocol 1.7 with a "
                     "trailing field this version does not know.",
                     _frame("h", *_fields(hb), {"gpu_util": 0.93})))
    add(_decode_only("heartbeat-old-frame", "The first three fields only.",
                     _frame("h", 0, ENGINE_INC, 3)))
    add(_roundtrip("heartbeat-counters-largest", "incarnation, seq, busy and loops at "
                   "2**64 - 1, the largest MessagePack integer: it decodes.",
                   Heartbeat(0, 2**64 - 1, 2**64 - 1, 2**64 - 1, "load", 1.0, 2**64 - 1)))
    # -- values -----------------------------------------------------------------------
    add(_value("value-step-request", "The payload of ctlwire.step (a map, by field name).", {
        "op": "op-7", "step": "load", "phase": "compensate", "fence": FENCE,
        "key": "op-7:load:undo", "method": "restore_weights", "args": None, "index": 1,
        "ranks": [0, 1]}, "StepRequest"))
    add(_value("value-take-over", "The payload of ctlwire.take_over.", {"fence": FENCE},
               "TakeOver"))
    add(_value("value-step-methods", "ctlwire.step_methods' answer.",
               ["pause", "update_weights", "restore_weights", "resume"]))
    add(_value("value-last-operation-never", "ctlwire.last_operation of a rank that never "
               "applied a step.", {"rank": 2, "op": "", "step": "", "phase": "", "fence": 0,
                                   "applied": [], "highest_fence": 0, "steps": [],
                                   "undone": [], "ranks": []}, "LastOperation"))
    # -- refused ----------------------------------------------------------------------
    add(_reject("reject-unknown-tag", "An array whose tag is no envelope kind.",
                _frame("x", 1, 0)))
    add(_reject("reject-missing-payload", "A request without its payload: malformed, its id "
                "salvageable.", _frame("q", 14, 0, "ping")))
    add(_reject("reject-method-not-a-string", "A request whose method is an integer.",
                _frame("q", 15, 0, 5, None)))
    add(_reject("reject-fence-as-float", "A fencing token written as a float.",
                _frame("q", 16, 0, "ping", None, 0.0, 0, 0, None, "", 1.5)))
    add(_reject("reject-a-map", "A map instead of an array.",
                msgspec.msgpack.encode({"id": 1, "method": "ping"})))
    add(_reject("reject-truncated", "A request cut short.",
                CODEC.encode(Request(17, 0, "ping", NIL))[:-3]))
    add(_reject("reject-not-msgpack", "Bytes that are no msgpack value.", b"\xc1\xc1"))
    add(_reject("reject-trailing-bytes", "A valid envelope followed by another byte.",
                CODEC.encode(Request(18, 0, "ping", NIL)) + b"\x00"))
    # -- refused: a field out of its range -------------------------------------------
    add(_reject("reject-id-zero", "A request id of 0 (ids are 1 .. 2**64 - 1): malformed, "
                "no id to answer.", _frame("q", 0, 0, "ping", None)))
    add(_reject("reject-negative-id", "A negative request id: malformed, no id to answer.",
                _frame("q", -19, 0, "ping", None)))
    add(_reject("reject-negative-seq", "A negative sequence number: malformed, its id "
                "answered.", _frame("q", 20, 0, "ping", None, 0.0, -1)))
    add(_reject("reject-version-beyond-16-bits", "A version of 65536 (versions are "
                "0 .. 65535): malformed, not another major version.",
                _frame("q", 21, 0, "ping", None, 0.0, 0, 0, None, "", 0, 0x10000)))
    add(_reject("reject-negative-deadline", "A negative deadline (0: none; else positive "
                "and finite).", _frame("q", 22, 0, "ping", None, -1.0)))
    add(_reject("reject-nan-deadline", "A NaN deadline.",
                _frame("q", 23, 0, "ping", None, float("nan"))))
    add(_reject("reject-infinite-deadline", "An infinite deadline.",
                _frame("q", 24, 0, "ping", None, float("inf"))))
    add(_reject("reject-reply-id-zero", "A reply to id 0: malformed (a client drops it).",
                _frame("r", 0, 0, ENGINE_INC, True, None)))
    add(_reject("reject-reply-negative-rank", "A reply from rank -1 (engine ranks are "
                "0 .. 999999999).", _frame("r", 25, -1, ENGINE_INC, True, None)))
    add(_reject("reject-heartbeat-rank-below-client", "A heartbeat of rank -2 (-1 is a "
                "client; engines 0 .. 999999999).", _frame("h", -2, ENGINE_INC)))
    add(_reject("reject-heartbeat-rank-ten-digits", "A heartbeat of rank 1000000000.",
                _frame("h", 1_000_000_000, ENGINE_INC)))
    add(_reject("reject-heartbeat-negative-busy-for", "A heartbeat whose busy_for is "
                "negative.", _frame("h", 0, ENGINE_INC, 1, 0, "x", -0.5)))
    add(_reject("reject-reply-error-one-element", "An ErrorInfo of one element (fewer "
                "than two): the reply is malformed.",
                _frame("r", 26, 0, ENGINE_INC, False, None, ["RuntimeError"])))
    add(_reject("reject-reply-error-code-as-float", "An ErrorInfo whose code is a float: "
                "the reply is malformed.",
                _frame("r", 27, 0, ENGINE_INC, False, None, ["RuntimeError", "boom", 1.0])))
    # -- refused: beyond a decode bound (docs/protocol.md, Limits) --------------------
    add(_reject("reject-method-too-long", "A method of 257 characters (at most 256): "
                "malformed, its id answered.", _frame("q", 28, 0, "m" * 257, None)))
    add(_reject("reject-trace-too-many-entries", "A trace map of 17 entries (at most 16): "
                "malformed, its id answered.",
                _frame("q", 29, 0, "ping", None, 0.0, 0, 0, {f"t{i}": "v" for i in range(17)})))
    add(_reject("reject-trace-key-too-long", "A trace key of 257 characters (at most 256): "
                "malformed, its id answered.",
                _frame("q", 30, 0, "ping", None, 0.0, 0, 0, {"k" * 257: "v"})))
    add(_reject("reject-trace-value-too-long", "A trace value of 8193 characters (at most "
                "8192): malformed, its id answered.",
                _frame("q", 31, 0, "ping", None, 0.0, 0, 0, {"traceparent": "v" * 8193})))
    add(_reject("reject-heartbeat-progress-above-one", "A heartbeat whose progress is above "
                "1 (negative: none; else 0 .. 1).",
                _frame("h", 0, ENGINE_INC, 1, 0, "x", 0.5, 1, 1.5)))
    return out


def write() -> None:
    VECTORS.mkdir(parents=True, exist_ok=True)
    for old in VECTORS.glob("*.json"):
        old.unlink()
    for case in cases():
        path = VECTORS / f"{case['name']}.json"
        path.write_text(json.dumps(case, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write()
    sys.stdout.write(f"wrote {len(cases())} vectors to {VECTORS}\n")
