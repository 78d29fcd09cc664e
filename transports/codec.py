"""Codecs: envelopes to bytes and back, payload values to ``Raw`` and back.

* :class:`MsgpackCodec` (default) and :class:`JsonCodec` — msgspec, typed,
  validating; decoding never executes code.
* :class:`PickleCodec` — envelopes stay msgpack, payload values are pickled.
  Only constructed with ``allow_pickle=True``; transports refuse it on every
  channel whose peers are not all authenticated (see :func:`check_pickle_allowed`).

Every codec enforces ``max_message_size``, the protocol's frame limit:
:meth:`Codec.decode` raises
:class:`~ctlwire.transports.errors.OversizedFrame` before parsing a larger frame
(whose id :meth:`Codec.salvage_id` still reads, so it can be answered),
:class:`~ctlwire.transports.errors.MalformedFrame` for anything that is not a
valid envelope, and :meth:`Codec.decode_value` raises :class:`PayloadTypeError`
when a value does not match the expected type.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, cast

import msgspec

from ctlwire.transports.envelope import Envelope, Heartbeat, Reply, Request
from ctlwire.transports.errors import CtlwireError, MalformedFrame, OversizedFrame, PickleRefused

__all__ = [
    "DEFAULT_MAX_MESSAGE_SIZE",
    "Codec",
    "JsonCodec",
    "MsgpackCodec",
    "PayloadTypeError",
    "PickleCodec",
    "check_pickle_allowed",
    "codec_by_name",
]

T = TypeVar("T")
#: Control messages are small: 16 MiB leaves room for large results (server info,
#: weight manifests) while keeping what a peer can make libzmq buffer bounded.
DEFAULT_MAX_MESSAGE_SIZE = 16 * 1024 * 1024
#: How much of a malformed frame :meth:`Codec.salvage_id` looks at.
_SALVAGE_PREFIX = 64
#: Stand-ins for a request's ``rank`` and ``seq`` while its encoding is cut into a
#: template (:meth:`Codec.request_splicer`): wide enough to encode the same way as any
#: value these fields take, unlikely to occur anywhere else in a frame.
_RANK_MARK = 0x5EC7_1CE5_0000_7A4B
_SEQ_MARK = 0x5EC7_1CE5_0000_5E91
_JSON_REQUEST_ID = re.compile(rb'\s*\[\s*"q"\s*,\s*(\d{1,20})\s*[,\]]')
#: request ids are below this (msgpack's largest unsigned integer is one less)
_ID_BOUND = 1 << 64


def _msgpack_request_id(head: bytes) -> int:
    """The id of a msgpack ``["q", id, ...]`` array from its first bytes, else 0.

    Reads the array header, the one-character tag and an integer: never more than
    18 bytes, whatever follows. A negative integer is no id (0).
    """
    if len(head) < 4:
        return 0
    b = head[0]
    if 0x91 < b <= 0x9F:  # fixarray of 2..15
        pos = 1
    elif b == 0xDC:  # array 16
        pos = 3
    elif b == 0xDD:  # array 32
        pos = 5
    else:
        return 0
    tag = head[pos:pos + 2]
    if tag == b"\xa1q":  # fixstr "q"
        pos += 2
    elif head[pos:pos + 3] == b"\xd9\x01q":  # str8 "q"
        pos += 3
    else:
        return 0
    if pos >= len(head):
        return 0
    b = head[pos]
    if b <= 0x7F:
        return b
    width = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}.get(b)
    raw = head[pos + 1:pos + 1 + width] if width else b""
    if not width or len(raw) != width:
        return 0
    return max(0, int.from_bytes(raw, "big", signed=b >= 0xD0))


class PayloadTypeError(CtlwireError, ValueError):
    """A payload or result does not match the declared type."""


class Codec:
    """Base class: subclasses provide the msgspec encoder/decoder pair."""

    name: ClassVar[str] = "abstract"
    uses_pickle: ClassVar[bool] = False

    def __init__(self, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> None:
        if max_message_size <= 0:
            raise ValueError("max_message_size must be positive")
        self.max_message_size = max_message_size

    def _encode(self, obj: Any) -> bytes:
        raise NotImplementedError

    def _decode_envelope(self, data: bytes | memoryview) -> Envelope:
        raise NotImplementedError

    def _decode_raw(self, data: bytes | memoryview, tp: Any) -> Any:
        raise NotImplementedError

    def encode(self, envelope: Envelope) -> bytes:
        """Envelope to bytes; raises OversizedFrame past the limit."""
        data = self._encode(envelope)
        if len(data) > self.max_message_size:
            raise OversizedFrame(len(data), self.max_message_size)
        return data

    def decode(self, data: bytes | memoryview) -> Envelope:
        """Bytes to envelope; raises OversizedFrame or MalformedFrame, nothing else."""
        size = len(data)
        if size > self.max_message_size:
            raise OversizedFrame(size, self.max_message_size)
        try:
            return self._decode_envelope(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise MalformedFrame(f"not a ctlwire envelope ({self.name}): {exc}") from None
        except (RecursionError, MemoryError, ValueError, TypeError) as exc:  # pragma: no cover
            raise MalformedFrame(f"undecodable frame ({self.name}): {exc!r}") from None

    def fast_envelope_decoder(self) -> Callable[[bytes], Envelope] | None:
        """For the receive hot path: a function that decodes a frame no larger than
        :attr:`max_message_size` into an envelope, raising *something* for a frame
        that is not one (then :meth:`decode` gives the typed verdict). None when this
        codec has no such shortcut."""
        return None

    def fast_envelope_encoder(self) -> Callable[[Envelope], bytes] | None:
        """For the send hot path: a function that encodes an envelope as
        :meth:`encode` does, *without* its size check (the caller compares the
        length with :attr:`max_message_size` itself). None when this codec has no
        such shortcut."""
        return None

    def request_splicer(self, template: Request) -> Callable[[int, int], bytes] | None:
        """For a fan-out's send path: ``splice(rank, seq)`` gives what :meth:`encode`
        gives for ``template`` with its ``rank`` and ``seq`` replaced (without the size
        check: the caller compares the length with :attr:`max_message_size`), from
        one encoding of the template cut around those two fields, instead of one
        full encoding per rank. None when this codec has no such shortcut or the
        template cannot be cut (then encode each request)."""
        return None

    def fast_value_codec(self, tp: Any = Any
                         ) -> tuple[Callable[[Any], bytes], Callable[[Any], Any]] | None:
        """For the engine's per-request hot path: ``(encode, decode)`` functions that
        give what :meth:`encode_value` (as bytes) and :meth:`decode_value` (as ``tp``)
        give for values they accept, raising *something* otherwise (then the slow
        methods give the typed verdict). None when this codec has no such shortcut."""
        return None

    def salvage_id(self, data: bytes | memoryview) -> int:
        """The request id of an undecodable or oversized frame, when it is readable
        (an id is ``1 .. 2**64 - 1``); else 0.

        Lets an engine answer a malformed or oversized request with a typed error
        the caller can match, instead of leaving it to time out. Never raises.
        Bounded: only the first bytes are read (the array header, the ``"q"`` tag
        and the id), nothing else of the frame is parsed or materialised, so the
        cost is the same for a 100-byte frame and a 60 MB one.
        """
        try:
            rid = self._salvage_prefix(memoryview(data)[:_SALVAGE_PREFIX])
        except Exception:  # pragma: no cover - the parsers below index defensively
            return 0
        return rid if 0 < rid < _ID_BOUND else 0

    def _salvage_prefix(self, head: memoryview) -> int:
        return 0

    def encode_value(self, value: Any) -> msgspec.Raw:
        """A payload or result value, encoded for an envelope's Raw field."""
        try:
            return msgspec.Raw(self._encode(value))
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            # RecursionError: nested deeper than msgspec's limit (which depends on the stack)
            raise PayloadTypeError(f"cannot encode {type(value).__name__}: {exc}") from None

    def decode_value(self, raw: msgspec.Raw, tp: Any = Any) -> Any:
        """A Raw field decoded (and validated) as ``tp``; a fresh object each call."""
        data = bytes(raw) if len(raw) else self._encode(None)
        try:
            return self._decode_raw(data, tp)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise PayloadTypeError(str(exc)) from None
        except RecursionError as exc:  # a value that fit in its envelope can still be too deep
            raise PayloadTypeError(f"value nested too deeply: {exc}") from None


class _MsgspecCodec(Codec):
    """A codec over one msgspec protocol module (``msgspec.msgpack`` or ``msgspec.json``):
    one encoder, a typed envelope decoder, and one cached decoder per value type."""

    _protocol: ClassVar[Any]

    def __init__(self, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> None:
        super().__init__(max_message_size)
        self._encoder = self._protocol.Encoder()
        self._envelope_decoder = self._protocol.Decoder(Request | Reply | Heartbeat)
        self._decoders: dict[Any, Any] = {}

    def _encode(self, obj: Any) -> bytes:
        data: bytes = self._encoder.encode(obj)
        return data

    def _decode_envelope(self, data: bytes | memoryview) -> Envelope:
        env: Envelope = self._envelope_decoder.decode(data)
        return env

    def _decode_raw(self, data: bytes | memoryview, tp: Any) -> Any:
        dec = self._decoders.get(tp)
        if dec is None:
            dec = self._decoders[tp] = self._protocol.Decoder(tp)
        return dec.decode(data)

    def _unchanged(self, *names: str) -> bool:
        """None of ``names`` is overridden below this class (a shortcut stays exact)."""
        return all(getattr(type(self), n) is getattr(_MsgspecCodec, n) for n in names)

    def fast_envelope_decoder(self) -> Callable[[bytes], Envelope] | None:
        if not self._unchanged("decode", "_decode_envelope"):
            return None
        return cast(Callable[[bytes], Envelope], self._envelope_decoder.decode)

    def fast_envelope_encoder(self) -> Callable[[Envelope], bytes] | None:
        if not self._unchanged("encode", "_encode"):
            return None
        return cast(Callable[[Envelope], bytes], self._encoder.encode)

    def request_splicer(self, template: Request) -> Callable[[int, int], bytes] | None:
        if not self._splices():
            return None
        return _splicer(self._encoder.encode, template)

    def _splices(self) -> bool:
        """Whether a spliced request encodes exactly as :meth:`encode` would (checked
        once per codec, over sample requests and field values)."""
        ok: bool | None = self.__dict__.get("_splice_ok")
        if ok is None:
            ok = self._unchanged("encode", "_encode") and _splice_self_test(self._encoder.encode)
            self.__dict__["_splice_ok"] = ok
        return ok

    def fast_value_codec(self, tp: Any = Any
                         ) -> tuple[Callable[[Any], bytes], Callable[[Any], Any]] | None:
        if not self._unchanged("encode_value", "decode_value", "_encode", "_decode_raw"):
            return None
        dec = self._decoders.get(tp)
        if dec is None:
            dec = self._decoders[tp] = self._protocol.Decoder(tp)
        return self._encoder.encode, dec.decode


def _splicer(encode: Callable[[Any], bytes], template: Request
             ) -> Callable[[int, int], bytes] | None:
    """``splice(rank, seq)`` for ``template`` (see :meth:`Codec.request_splicer`), or
    None when the marks do not occur exactly once each, rank's first."""
    data = encode(msgspec.structs.replace(template, rank=_RANK_MARK, seq=_SEQ_MARK))
    rank_mark, seq_mark = encode(_RANK_MARK), encode(_SEQ_MARK)
    at_rank, at_seq = data.find(rank_mark), data.find(seq_mark)
    if (at_rank < 0 or at_seq < at_rank + len(rank_mark)
            or data.count(rank_mark) != 1 or data.count(seq_mark) != 1):
        return None
    head = data[:at_rank]
    middle = data[at_rank + len(rank_mark):at_seq]
    tail = data[at_seq + len(seq_mark):]
    join = b"".join

    def splice(rank: int, seq: int) -> bytes:
        return join((head, encode(rank), middle, encode(seq), tail))

    return splice


def _splice_self_test(encode: Callable[[Any], bytes]) -> bool:
    """Spliced requests equal full encodings, over field values of every width."""
    raw = msgspec.Raw(encode({"x": [1, 2.5, "y"]}))
    samples = [Request(1, 0, "m", raw),
               Request(2**40, 5, "x" * 40, raw, 1.7e9, 3, 2**62, {"t": "p"}, "k", 2**33)]
    values = (0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**62)
    for template in samples:
        splice = _splicer(encode, template)
        if splice is None:
            return False
        for rank in values:
            for seq in values:
                if splice(rank, seq) != encode(msgspec.structs.replace(template, rank=rank,
                                                                        seq=seq)):
                    return False
    return True


class MsgpackCodec(_MsgspecCodec):
    """msgspec MessagePack (the default)."""

    name = "msgpack"
    _protocol: ClassVar[Any] = msgspec.msgpack

    def _salvage_prefix(self, head: memoryview) -> int:
        return _msgpack_request_id(bytes(head))


class JsonCodec(_MsgspecCodec):
    """msgspec JSON: human-readable frames, same validation."""

    name = "json"
    _protocol: ClassVar[Any] = msgspec.json

    def _salvage_prefix(self, head: memoryview) -> int:
        match = _JSON_REQUEST_ID.match(bytes(head))
        return int(match.group(1)) if match else 0


class PickleCodec(MsgpackCodec):
    """Envelopes in msgpack, payload values pickled. Unsafe with untrusted peers.

    Construct with ``allow_pickle=True`` or it raises :class:`PickleRefused`.
    Unpickling runs arbitrary code from the peer; transports refuse this codec
    unless every peer is authenticated (CURVE, inproc, an ipc socket in a 0700
    directory: :mod:`ctlwire.transports.channel_security`).
    """

    name = "pickle"
    uses_pickle = True

    def __init__(self, *, allow_pickle: bool = False,
                 max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> None:
        if not allow_pickle:
            raise PickleRefused("PickleCodec needs allow_pickle=True: unpickling runs peer code")
        super().__init__(max_message_size)

    def encode_value(self, value: Any) -> msgspec.Raw:
        try:
            blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as exc:
            raise PayloadTypeError(f"cannot pickle {type(value).__name__}: {exc}") from None
        return msgspec.Raw(self._encode(blob))

    def decode_value(self, raw: msgspec.Raw, tp: Any = Any) -> Any:
        if not len(raw):
            value = None
        else:
            try:
                blob = self._decode_raw(bytes(raw), bytes)
                value = pickle.loads(blob)
            except Exception as exc:
                raise PayloadTypeError(f"cannot unpickle value: {exc!r}") from None
        if tp is Any:
            return value
        try:
            return msgspec.convert(value, tp, from_attributes=True)
        except (msgspec.ValidationError, RecursionError) as exc:
            raise PayloadTypeError(str(exc)) from None


def check_pickle_allowed(codec: Codec, address: str, curve: bool) -> None:
    """Raise PickleRefused when ``codec`` pickles over a channel where a peer could be
    unauthenticated (the rule of :mod:`ctlwire.transports.channel_security`)."""
    from ctlwire.transports.channel_security import check_pickle_channel

    check_pickle_channel(codec.uses_pickle, (address,), curve=curve)


def codec_by_name(name: str, *, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
                  allow_pickle: bool = False) -> Codec:
    """``"msgpack"``, ``"json"`` or ``"pickle"`` (the last only with allow_pickle)."""
    if name == "msgpack":
        return MsgpackCodec(max_message_size)
    if name == "json":
        return JsonCodec(max_message_size)
    if name == "pickle":
        return PickleCodec(allow_pickle=allow_pickle, max_message_size=max_message_size)
    raise ValueError(f"unknown codec {name!r}: expected msgpack, json or pickle")
