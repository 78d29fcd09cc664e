"""Fuzzing: the codecs, the engine endpoint and the client against hostile frames.

Hypothesis generates frames in batches: random bytes, valid envelopes, and valid
envelopes truncated or mutated (bit flips, byte insertions and deletions, field
swaps, a wrong type in each field, missing and extra fields, a wrong tag),
msgpack headers that claim 2^32 elements or bytes, JSON numbers out of range,
deeply nested values (around the interpreter's recursion limit too) and
oversized frames. Properties:

* **Codecs.** ``decode`` raises only MalformedFrame/OversizedFrame,
  ``decode_value``/``encode_value`` only PayloadTypeError (also when called from
  a deeper stack), ``salvage_id`` never raises.
* **Engine.** ``EngineEndpoint.poll()`` never raises; every request gets exactly
  one reply (a result or a typed error) unless it is a duplicate, every
  malformed frame whose id is readable gets a MalformedFrame error, everything
  else is counted; the counters add up exactly; a good request is still served.
* **Client.** Every frame reaching a ``ControlClient`` is counted exactly once
  (dropped, heartbeat, stale, unknown/late/duplicate/stray or accepted reply);
  the call in flight gets one outcome (a value or a typed error); good calls
  still work (to rank 0 too, unless a fuzzed heartbeat announced a newer
  incarnation of it: then its real, older process is stale by design).

Each test prints how many frames it fuzzed; the module prints the total (at
least 10,000 per run, checked by the last test).
"""

from __future__ import annotations

import gc
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctlwire.kernel.client.control_client import ResultTypeError
from ctlwire.kernel.core.request_registry import PendingRequest
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.errors import EngineDead, RemoteError, RequestTimedOut
from ctlwire.states import RequestEvent, RequestState
from ctlwire.testing import EngineHarness
from ctlwire.transports.codec import Codec, JsonCodec, MsgpackCodec, PayloadTypeError
from ctlwire.transports.envelope import MAX_METHOD_CHARS, ErrorInfo, Heartbeat, Reply, Request
from ctlwire.transports.errors import MalformedFrame, OversizedFrame
from ctlwire.transports.memory import MemoryNetwork
from ctlwire.transports.transport import Received

MAX = 4096  # the codecs' limit here: oversized frames stay cheap to build
NOW = 1000.0  # the engine's wall clock: deadline 500 has passed, 2000 has not
PER_EXAMPLE_S = 10.0  # a batch taking longer than this counts as a hang
CI_MINIMUM = 10_000
CODEC_NAMES = ("msgpack", "json")
FUZZED: Counter[str] = Counter()
HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
          HealthCheck.function_scoped_fixture]


def make_codec(name: str) -> Codec:
    return MsgpackCodec(MAX) if name == "msgpack" else JsonCodec(MAX)


def enc(name: str, value: Any) -> bytes:
    return msgspec.msgpack.encode(value) if name == "msgpack" else msgspec.json.encode(value)


def dec(name: str, data: bytes) -> Any:
    return msgspec.msgpack.decode(data) if name == "msgpack" else msgspec.json.decode(data)


def join_fields(name: str, parts: list[bytes]) -> bytes:
    """An array of already-encoded elements (any of them may be garbage)."""
    if name == "json":
        return b"[" + b",".join(parts) + b"]"
    n = len(parts)
    head = bytes([0x90 | n]) if n < 16 else b"\xdc" + n.to_bytes(2, "big")
    return head + b"".join(parts)


def nested(name: str, depth: int, style: str) -> bytes:
    if name == "msgpack":
        return (b"\x91" if style == "list" else b"\x81\xa1k") * depth + b"\xc0"
    if style == "list":
        return b"[" * depth + b"null" + b"]" * depth
    return b'{"k":' * depth + b"null" + b"}" * depth


@contextmanager
def default_recursion_limit() -> Iterator[None]:
    """Hypothesis raises the recursion limit while it runs a test; put back
    CPython's default (1000, or what this stack needs plus room) so that values
    nested near msgspec's real limit are generated and checked. The collector
    is off meanwhile: a finalizer of an earlier test's garbage would otherwise
    run at this depth and be reported as an unraisable RecursionError."""
    old = sys.getrecursionlimit()
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    sys.setrecursionlimit(max(1000, depth + 250))
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        sys.setrecursionlimit(old)


def at_depth(extra: int, fn: Callable[[], Any]) -> Any:
    """Call ``fn`` ``extra`` Python frames deeper (recursion limits depend on the stack)."""
    return fn() if extra <= 0 else at_depth(extra - 1, fn)


# -- strategies ------------------------------------------------------------------------
METHODS = ["echo", "typed", "noarg", "fail", "unencodable", "async_m", "deep_result", "big"]
scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
           | st.binary(max_size=12))
values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=4)
                      | st.dictionaries(st.text(max_size=6), kids, max_size=4), max_leaves=12)
payloads = (values | st.fixed_dictionaries({"weight": st.floats(-1e6, 1e6)})
            | st.fixed_dictionaries({"weight": values, "tags": st.lists(values, max_size=2)}))
ids = st.sampled_from([1, 2, 3, 2**40]) | st.integers(-(2**63), 2**64 - 1)
ranks = st.sampled_from([0, 0, 0, 1, -1, 2**63])
# near the frame limit: a request that fits, whose error reply (quoting it) would not
long_text = st.integers(MAX - 200, MAX).map(lambda n: "m" * n) | st.integers(
    MAX - 75, MAX - 35).map(lambda n: "m" * n)
methods = (st.sampled_from(METHODS) | st.sampled_from(["nope", "__class__", ""])
           | st.text(max_size=16) | long_text)
deadlines = st.sampled_from([0.0, 0.0, 500.0, 2000.0]) | st.floats(allow_nan=False,
                                                                   allow_infinity=False)
traces = st.none() | st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2)
WEIRD = [None, True, False, 0, -1, 2**63 - 1, 2**64 - 1, -(2**63), 1.5, -0.0, "", "q", "r", "h",
         "echo", b"", b"\x00\xff", [], {}, [1, "x"], {"k": 1}, ["q", 1]]
weird_values = st.sampled_from(WEIRD) | values | long_text
MSGPACK_HUGE = [
    b"\xdd\xff\xff\xff\xff",  # array32: 2^32-1 elements
    b"\xdf\xff\xff\xff\xff",  # map32
    b"\xdb\xff\xff\xff\xff",  # str32: 2^32-1 bytes
    b"\xc6\xff\xff\xff\xff",  # bin32
    b"\xc9\xff\xff\xff\xff\x01",  # ext32
    b"\xdd\x80\x00\x00\x00", b"\xdc\xff\xff", b"\xde\xff\xff", b"\xda\xff\xff", b"\xc5\xff\xff",
    b"\xc1",  # never used
    b"\xd7\xff" + b"\xff" * 8,  # timestamp64, nanoseconds out of range
    b"\xc7\x0c\xff" + b"\x00" * 4 + b"\x7f" + b"\xff" * 7,  # timestamp96 past year 9999
    b"\xd4\xff\x00",  # timestamp of a wrong length
]
JSON_BAD = [b"1e99999", b"-1e99999", b"9" * 400, b"9" * 5000, b"-" + b"9" * 30, b'"\\ud800"',
            b'"\\u00"', b"nul", b"tru", b'"' + b"a" * 100, b"[" * 10, b'{"a":}', b"0x10",
            b"NaN", b"Infinity", b"01", b"1.", b"-", b'"\xff\xfe"', b"\x00"]


def envelope_strategy(codec: Codec, kinds: str) -> st.SearchStrategy[Any]:
    """Valid envelopes: ``kinds`` is a string of q (request), r (reply), h (heartbeat)."""
    raw = payloads.map(codec.encode_value)
    errors = st.none() | st.builds(ErrorInfo, st.text(max_size=8), st.text(max_size=8),
                                   st.integers(-(2**31), 2**31))
    by_kind: dict[str, st.SearchStrategy[Any]] = {
        "q": st.builds(Request, ids, ranks, methods, raw, deadlines, st.integers(0, 2**32),
                       st.sampled_from([0, 7, 2**30]), traces),
        "r": st.builds(Reply, ids, ranks, st.integers(0, 2**31), st.booleans(), raw, errors),
        "h": st.builds(Heartbeat, ranks, st.integers(0, 2**31), st.integers(0, 2**31)),
    }
    return st.one_of([by_kind[k] for k in kinds])  # repeating a kind weights it


KINDS = ["random", "valid", "valid", "truncate", "bitflip", "insert", "delete", "swap",
         "wrong_type", "wrong_type", "arity", "tag", "huge", "deep", "oversized"]
TAGS: list[Any] = ["q", "r", "h", "x", "", "Q", "qq", 0, -1, 2**64 - 1, None]


def mutate(name: str, rng: random.Random, data: bytes, pool: list[Any],
           near_limit: bool = True) -> bytes:
    """One frame from a valid encoded envelope: kept, replaced by random bytes, or
    damaged in one of many ways (``pool``: values to put in the wrong field).
    ``near_limit``: nest values around the recursion limit too (where decoding
    depends on the stack depth); else only well below or well above it."""
    kind = rng.choice(KINDS)
    n = len(data)
    if kind == "random":
        return rng.randbytes(rng.randint(0, 200))
    if kind == "valid":
        return data
    if kind == "truncate":
        return data[: rng.randint(0, n - 1)]
    if kind == "bitflip":
        out = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            out[rng.randrange(n)] ^= 1 << rng.randrange(8)
        return bytes(out)
    if kind == "insert":
        i = rng.randint(0, n)
        return data[:i] + rng.randbytes(rng.randint(1, 8)) + data[i:]
    if kind == "delete":
        i = rng.randrange(n)
        return data[:i] + data[i + rng.randint(1, 8):]
    if kind == "oversized":
        return data + bytes([rng.randrange(256)]) * max(0, MAX + rng.randint(1, 2 * MAX) - n)
    parts = [enc(name, f) for f in dec(name, data)]
    i = rng.randrange(len(parts))
    if kind == "swap":
        j = rng.randrange(len(parts))
        parts[i], parts[j] = parts[j], parts[i]
    elif kind == "wrong_type":
        parts[i] = enc(name, rng.choice(pool + WEIRD))
    elif kind == "arity":
        if rng.random() < 0.5:
            parts = parts[: rng.randrange(len(parts))]
        else:
            parts += [enc(name, rng.choice(pool + WEIRD)) for _ in range(rng.randint(1, 3))]
    elif kind == "tag":
        parts[0] = enc(name, rng.choice(TAGS))
    elif kind == "huge":
        bad = rng.choice(MSGPACK_HUGE if name == "msgpack" else JSON_BAD)
        if rng.random() < 0.2:
            return bad + data  # the whole frame claims a huge length / is garbage
        parts[i] = bad + rng.randbytes(rng.randint(0, 4))
    elif kind == "deep":
        if near_limit:  # 500..1000 straddles the default limit, whatever the stack depth
            depth = rng.randint(500, 1000) if rng.random() < 0.5 else rng.randint(1, 1500)
        else:
            depth = rng.randint(1, 400) if rng.random() < 0.5 else rng.randint(2500, 3500)
        if len(parts) > 4 and rng.random() < 0.5:
            i = 4  # the payload / result: a frame that may still decode as an envelope
        parts[i] = nested(name, depth, rng.choice(["list", "map"]))
    return join_fields(name, parts)


@st.composite
def frame_batches(draw: st.DrawFn, name: str, seeds: st.SearchStrategy[Any],
                  min_frames: int = 24, max_frames: int = 64, near_limit: bool = False
                  ) -> list[bytes]:
    """A batch of frames: hypothesis draws the base envelopes, a pool of odd values
    and a seed; a seeded RNG derives the mutations (cheap, and reproducible)."""
    envs = [enc(name, e) for e in draw(st.lists(seeds, min_size=1, max_size=4))]
    pool = draw(st.lists(weird_values, min_size=1, max_size=4))
    rng = random.Random(draw(st.integers(0, 2**64 - 1)))
    count = draw(st.integers(min_frames, max_frames))
    return [mutate(name, rng, rng.choice(envs), pool, near_limit) for _ in range(count)]


@pytest.fixture(scope="module", autouse=True)
def fuzz_summary(pytestconfig: pytest.Config) -> Iterator[None]:
    """After the module: the total number of frames fuzzed, printed past capture."""
    yield
    if not FUZZED:
        return
    capman = pytestconfig.pluginmanager.getplugin("capturemanager")
    line = (f"\nfuzz: {sum(FUZZED.values()):,} frames in total, 0 crashes, 0 hangs "
            f"({', '.join(f'{k} {v:,}' for k, v in sorted(FUZZED.items()))})\n")
    if capman is None:
        print(line)
    else:
        with capman.global_and_fixture_disabled():
            sys.stdout.write(line)


def report(capsys: pytest.CaptureFixture[str], key: str, frames: int, started: float) -> None:
    FUZZED[key] += frames
    with capsys.disabled():
        print(f"\nfuzz[{key}]: {frames:,} frames, 0 crashes "
              f"({time.monotonic() - started:.1f} s)", end="")


# -- 1. codecs -----------------------------------------------------------------------
class Load(msgspec.Struct):
    weight: float
    tags: list[str] = []


VALUE_TYPES: list[Any] = [Any, int, float, str, bytes, Load, list[int], dict[str, Any],
                          int | None]


def check_value(codec: Codec, raw: msgspec.Raw, extra: int) -> None:
    """decode_value/encode_value raise only PayloadTypeError, at any stack depth
    (a value decoded inside its envelope may be decoded again from a deeper
    stack, e.g. in the caller's task, where msgspec's recursion limit is closer)."""
    depths = (extra, extra + 40, extra + 120) if len(raw) >= 256 else (extra,)
    for tp in VALUE_TYPES:
        for depth in depths:
            try:
                value = at_depth(depth, lambda tp=tp: codec.decode_value(raw, tp))
            except PayloadTypeError:
                continue
            with suppress(PayloadTypeError):
                at_depth(depth, lambda value=value: codec.encode_value(value))


def check_frame(codec: Codec, frame: bytes, extra: int) -> None:
    try:
        env = codec.decode(frame)
    except OversizedFrame:
        assert len(frame) > MAX
    except MalformedFrame:
        assert len(frame) <= MAX
    else:
        assert type(env) in (Request, Reply, Heartbeat) and len(frame) <= MAX
        if isinstance(env, Request):
            check_value(codec, env.payload, extra)
        elif isinstance(env, Reply):
            check_value(codec, env.result, extra)
    assert isinstance(codec.salvage_id(frame), int)
    check_value(codec, msgspec.Raw(frame), extra)  # the whole frame as a payload value


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", CODEC_NAMES)
def test_codec_raises_only_typed_errors(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    codec = make_codec(name)
    started, count = time.monotonic(), 0

    @settings(max_examples=300, deadline=None, suppress_health_check=HEALTH,
              report_multiple_bugs=False)
    @given(batch=frame_batches(name, envelope_strategy(codec, "qqrh"), near_limit=True),
           extra=st.integers(0, 80))
    def run(batch: list[bytes], extra: int) -> None:
        nonlocal count
        t0 = time.monotonic()
        with default_recursion_limit():
            for frame in batch:
                check_frame(codec, frame, extra)
        count += len(batch)
        assert time.monotonic() - t0 < PER_EXAMPLE_S

    run()
    report(capsys, f"codec-{name}", count, started)


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_values_nested_near_the_recursion_limit_give_payload_type_errors(name: str) -> None:
    """Regression: msgspec raises RecursionError (not DecodeError) past its depth
    limit, and the limit depends on the caller's stack: a payload that decoded
    inside the envelope could fail later in decode_value/encode_value."""
    codec = make_codec(name)
    for depth in range(900, 1100, 7):
        raw = msgspec.Raw(nested(name, depth, "list"))
        for extra in (0, 30, 100):
            try:
                value = at_depth(extra, lambda raw=raw: codec.decode_value(raw))
            except PayloadTypeError:
                continue
            with suppress(PayloadTypeError):
                at_depth(extra, lambda value=value: codec.encode_value(value))
    too_deep: list[Any] = []
    for _ in range(5000):
        too_deep = [too_deep]
    with pytest.raises(PayloadTypeError):
        codec.encode_value(too_deep)


# -- 2. the engine endpoint (poll) ---------------------------------------------------------
# typed answers a well-formed request may get; "Fenced": a fencing token below one the
# engine already accepted (hypothesis draws the tokens), "FenceOutOfRange": one negative or
# too far ahead of the engine's clock, "InProgress": an idempotency key still running,
# "KeyTooLong" and "CacheFull": a key the idempotency cache does not take,
# "UnsupportedProtocolVersion": a request announcing another major protocol version
REQUEST_ERRORS = {"WrongRank", "UnknownMethod", "DeadlineExpired", "InvalidPayload",
                  "RuntimeError", "ResultNotEncodable", "AsyncHandlerInPoll", "ReplyTooLarge",
                  "Fenced", "FenceOutOfRange", "InProgress", "KeyTooLong", "CacheFull",
                  "UnsupportedProtocolVersion"}


def engine_methods(ep: EngineEndpoint) -> None:
    @ep.method()
    def echo(value: Any = None) -> Any:
        return value

    @ep.method()
    def typed(q: Load) -> float:
        return q.weight * 2

    @ep.method()
    def noarg() -> str:
        return "ok"

    @ep.method()
    def fail(message: str = "requested") -> None:
        raise RuntimeError(message)

    @ep.method()
    def unencodable() -> object:
        return object()

    @ep.method()
    async def async_m() -> None:
        return None

    @ep.method()
    def big() -> str:
        return "x" * MAX

    @ep.method()
    def deep_result() -> Any:
        out: list[Any] = []
        for _ in range(5000):
            out = [out]
        return out


def expected_replies(codec: Codec, frame: bytes, seen: set[tuple[int, int]]
                     ) -> list[tuple[int, int | None]]:
    """What the endpoint must send for ``frame``: [(id, required error code or None)]:
    an oversized or malformed frame whose id is readable is answered 413 or 400."""
    if len(frame) > MAX:
        sid = codec.salvage_id(frame)
        return [(sid, 413)] if sid else []
    try:
        env = codec.decode(frame)
    except MalformedFrame:
        sid = codec.salvage_id(frame)
        return [(sid, 400)] if sid else []
    if type(env) is Request:
        key = (0, env.id)  # one route here: ids are per route, whatever client they claim
        if key in seen:
            return []
        seen.add(key)
        return [(env.id, None)]
    return []


def run_engine_batch(name: str, batch: list[bytes]) -> None:
    codec = make_codec(name)
    net = MemoryNetwork(codec, buffer=len(batch) + 4)
    ep = EngineEndpoint(net.engine_transport(0), heartbeat_interval=None, clock=lambda: NOW)
    engine_methods(ep)
    client = net.client_transport()
    ep.open()
    expected: list[tuple[int, int | None]] = []
    seen: set[tuple[int, int]] = set()
    for frame in batch:
        net.inject_to_engine(0, frame)
        expected += expected_replies(codec, frame, seen)
    for _ in range(len(batch)):  # small polls: the loop boundary is exercised too
        ep.poll(max_messages=3)  # never raises: a crash fails the example
        if ep.counters["received"] == len(batch):
            break
    c = ep.counters
    assert c["received"] == len(batch)
    assert c.get("internal_errors", 0) == 0, ep.metrics()
    handled = sum(ep.states.values())
    dropped = sum(v for k, v in c.items() if k.startswith("dropped_"))
    assert c["received"] == handled + c["duplicates"] + c["heartbeats_received"] + dropped, c
    assert c["replied"] == handled + c["error_replies_for_bad_frames"], c
    assert c["reply_send_failures"] == 0, c
    replies: list[Reply] = []
    while (event := client.try_receive()) is not None:
        assert isinstance(event, Received) and isinstance(event.envelope, Reply), event
        replies.append(event.envelope)
    assert [r.id for r in replies] == [rid for rid, _ in expected]
    for reply, (_, must) in zip(replies, expected, strict=True):
        assert reply.rank == 0 and reply.incarnation == ep.incarnation
        if must is not None:
            assert not reply.ok and reply.error is not None and reply.error.code == must
        elif not reply.ok:
            assert reply.error is not None and reply.error.type in REQUEST_ERRORS, reply.error
    # still serving
    good = Request(2**62 + 1, 0, "echo", codec.encode_value("alive"), 0.0, 1, 424242)
    client.send_nowait(0, good)
    assert ep.poll() == 1
    event = client.try_receive()
    assert isinstance(event, Received) and isinstance(event.envelope, Reply)
    assert event.envelope.ok and codec.decode_value(event.envelope.result) == "alive"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", CODEC_NAMES)
def test_engine_endpoint_answers_or_counts_every_frame(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    codec = make_codec(name)
    started, count = time.monotonic(), 0

    @settings(max_examples=200, deadline=None, suppress_health_check=HEALTH,
              report_multiple_bugs=False)
    # not near_limit: the oracle decodes at another stack depth than the endpoint does
    @given(batch=frame_batches(name, envelope_strategy(codec, "qqqqrh")))
    def run(batch: list[bytes]) -> None:
        nonlocal count
        t0 = time.monotonic()
        with default_recursion_limit():
            run_engine_batch(name, batch)
        count += len(batch)
        assert time.monotonic() - t0 < PER_EXAMPLE_S

    run()
    report(capsys, f"engine-{name}", count, started)


def test_handler_returning_a_too_deep_result_gets_a_typed_error() -> None:
    """Regression: the result's RecursionError escaped _result_reply, so the
    caller got no reply at all and waited for its timeout."""
    codec = make_codec("msgpack")
    net = MemoryNetwork(codec)
    ep = EngineEndpoint(net.engine_transport(0), heartbeat_interval=None)
    engine_methods(ep)
    client = net.client_transport()
    ep.open()
    client.send_nowait(0, Request(5, 0, "deep_result", codec.encode_value(None), 0.0, 1, 1))
    assert ep.poll() == 1
    event = client.try_receive()
    assert isinstance(event, Received) and isinstance(event.envelope, Reply)
    assert event.envelope.error is not None
    assert event.envelope.error.type == "ResultNotEncodable"


def test_reply_too_large_for_the_codec_becomes_a_typed_error() -> None:
    """A result over the limit becomes ``ReplyTooLarge`` (the codec would refuse it on
    send, and no reply would go out); a method name too long to quote in an error is
    malformed as it is decoded, and answered ``MalformedFrame``."""
    codec = make_codec("msgpack")
    net = MemoryNetwork(codec)
    ep = EngineEndpoint(net.engine_transport(0), heartbeat_interval=None)
    engine_methods(ep)
    client = net.client_transport()
    ep.open()
    long_name = "m" * (MAX_METHOD_CHARS + 1)
    client.send_nowait(0, Request(6, 0, long_name, codec.encode_value(None), 0.0, 1, 1))
    client.send_nowait(0, Request(7, 0, "big", codec.encode_value(None), 0.0, 2, 1))
    assert ep.poll() == 1  # the malformed frame is answered, not handled
    got = [client.try_receive() for _ in range(2)]
    errors = [e.envelope.error for e in got if isinstance(e, Received)
              and isinstance(e.envelope, Reply)]
    assert [e.type if e else None for e in errors] == ["MalformedFrame", "ReplyTooLarge"]
    assert ep.counters["replies_too_large"] == 1 and ep.counters["reply_send_failures"] == 0


# -- 3. the client -----------------------------------------------------------------------
class EntryLog:
    """An observer keeping every request entry, to count the replies they accepted."""

    def __init__(self) -> None:
        self.entries: dict[int, PendingRequest] = {}

    def __call__(self, entry: PendingRequest, old: RequestState, event: RequestEvent,
                 new: RequestState) -> None:
        self.entries[entry.id] = entry

    @property
    def accepted(self) -> int:
        return sum(e.answered for e in self.entries.values())


def client_methods(gate: anyio.Event) -> Callable[[EngineEndpoint], None]:
    def setup(ep: EngineEndpoint) -> None:
        @ep.method()
        def echo(value: Any = None) -> Any:
            return value

        @ep.method()
        async def block() -> str:
            await gate.wait()
            return "released"

    return setup


def client_seeds(codec: Codec, live: int, tomb: int, incarnation: int
                 ) -> st.SearchStrategy[Any]:
    """Replies for the live call, a cleaned one and strangers; heartbeats; requests."""
    ids_ = st.sampled_from([live, live, tomb, 1]) | ids
    incs = st.sampled_from([incarnation] * 3 + [0, 12345])
    errors = st.none() | st.builds(ErrorInfo, st.text(max_size=8), st.text(max_size=8))
    return st.one_of(
        st.builds(Reply, ids_, st.sampled_from([0, 0, 1]), incs, st.booleans(),
                  payloads.map(codec.encode_value), errors),
        st.builds(Heartbeat, st.sampled_from([0, -1]), incs),
        envelope_strategy(codec, "q"))


def client_counted(h: EngineHarness, log: EntryLog) -> int:
    c, s = h.client, h.client.registry.stats
    dropped = sum(v for k, v in c.counters.items() if k.startswith("dropped_"))
    return (dropped + c.counters["heartbeats_received"] + c.counters["stale_incarnation"]
            + s.unknown + s.late + s.duplicate + s.stray + log.accepted)


def client_frames_in(h: EngineHarness, injected: int) -> int:
    sent = sum(ep.counters["replied"] + ep.counters["heartbeats_sent"]
               for ep in h.engines.values())
    return injected + sent


async def settle(h: EngineHarness, log: EntryLog, injected: int) -> None:
    """Wait until the client has accounted for every frame that reached it."""
    with anyio.fail_after(5):
        while client_counted(h, log) < client_frames_in(h, injected):
            await anyio.sleep(0)
    for _ in range(10):
        await anyio.sleep(0)
    assert client_counted(h, log) == client_frames_in(h, injected), (
        h.client.metrics(), log.accepted)


@pytest.mark.anyio
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", CODEC_NAMES)
@settings(max_examples=30, deadline=None, suppress_health_check=HEALTH,
              report_multiple_bugs=False)
@given(data=st.data())
async def test_client_counts_every_frame_and_keeps_serving(name: str, data: st.DataObject
                                                           ) -> None:
    started = time.monotonic()
    gate = anyio.Event()
    log = EntryLog()
    codec = make_codec(name)
    async with EngineHarness(2, client_methods(gate), codec=codec,
                             client_kwargs={"heartbeat_interval": None, "default_timeout": 5.0,
                                            "observer": log},
                             engine_kwargs={"heartbeat_interval": None}) as h:
        c, ep = h.client, h.engines[0]  # frames are injected as if rank 0 sent them
        with anyio.fail_after(PER_EXAMPLE_S):
            assert await c.call("echo", "warm") == "warm"
        tomb = max(log.entries)
        live = tomb + 1  # ids are consecutive: the call in flight will get this one
        # draw outside any task group (hypothesis' StopTest must not be wrapped in a group)
        batch = data.draw(frame_batches(name, client_seeds(codec, live, tomb, ep.incarnation)))
        outcome: list[Any] = []

        async def in_flight() -> None:
            try:
                outcome.append(await c.call("block"))
            except (RemoteError, ResultTypeError, EngineDead, RequestTimedOut) as exc:
                outcome.append(exc)

        with anyio.fail_after(PER_EXAMPLE_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(in_flight)
                while ep.counters["received"] < 2:
                    await anyio.sleep(0)
                assert [e.id for e in c.registry.live()] == [live]
                for frame in batch:
                    h.network.inject_to_client(0, frame)
                await settle(h, log, len(batch))
                ep.send_heartbeat()  # re-announce the real incarnation (a fuzzed one may rule)
                await settle(h, log, len(batch))
                gate.set()
            # one outcome: "released", whatever a fuzzed reply for the live id carried,
            # or a typed error (anything else propagated out of in_flight)
            assert len(outcome) == 1
            assert await c.call("echo", "other rank", rank=1) == "other rank"
            if c.peers.peers[0].incarnation == ep.incarnation:
                assert await c.call("echo", "after", rank=0) == "after"
            else:
                # a fuzzed heartbeat announced a newer incarnation of rank 0: by design the
                # real (older) process is now replaced and its frames are stale
                with pytest.raises((RequestTimedOut, EngineDead)):
                    await c.call("echo", "after", rank=0, timeout=0.3)
            await settle(h, log, len(batch))
            assert c.registry.live_count == 0
    FUZZED[f"client-{name}"] += len(batch)
    assert time.monotonic() - started < PER_EXAMPLE_S


@pytest.mark.anyio
async def test_failed_reply_without_error_info_is_a_remote_error() -> None:
    """Regression: ``Reply(ok=False, error=None)`` tripped an assert in the caller."""
    gate = anyio.Event()
    async with EngineHarness(1, client_methods(gate),
                             client_kwargs={"heartbeat_interval": None}) as h:
        c, codec = h.client, h.network.codec
        async with anyio.create_task_group() as tg:
            got: list[BaseException] = []

            async def call() -> None:
                with pytest.raises(RemoteError) as info:
                    await c.call("block", timeout=5)
                got.append(info.value)

            tg.start_soon(call)
            while not c.registry.live():
                await anyio.sleep(0)
            live = c.registry.live()[0].id
            h.network.inject_to_client(0, codec.encode(
                Reply(live, 0, h.engines[0].incarnation, False, codec.encode_value(None))))
        assert got and "UnknownRemoteError" in str(got[0])
        gate.set()


def test_fuzz_total_meets_the_ci_minimum(capsys: pytest.CaptureFixture[str]) -> None:
    """Last in the module: at least 10,000 frames when the whole module ran."""
    expected = {f"{part}-{n}" for part in ("codec", "engine", "client") for n in CODEC_NAMES}
    if not expected <= set(FUZZED):
        pytest.skip(f"only part of the fuzz module ran ({sorted(FUZZED)})")
    total = sum(FUZZED.values())
    with capsys.disabled():
        print(f"\nfuzz: {total:,} frames, 0 crashes", end="")
    assert total >= CI_MINIMUM
