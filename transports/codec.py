"""Codecs: envelopes to bytes and back, payload values to ``Raw`` and back.

* :class:`MsgpackCodec` (default) and :class:`JsonCodec` — msgspec, typed,
  validating; decoding never executes code.
* :class:`PickleCodec` — envelopes stay msgpack, payload values are pickled.
  Only constructed with ``allow_pickle=True``; transports refuse it on every
  channel whose peers are not all authenticated (see :func:`check_pickle_allowed`).

Every codec enforces ``max_message_size``: :meth:`Codec.decode` raises
:class:`~ctlwire.transports.errors.OversizedFrame` before parsing a larger frame,
:class:`~ctlwire.transports.errors.MalformedFrame` for anything that is not a
valid envelope, and :meth:`Codec.decode_value` raises :class:`PayloadTypeError`
when a value does not match the expected type.
"""

from __future__ import annotations

import pickle
from typing import Any, ClassVar, TypeVar

import msgspec

from ctlwire.transports.envelope import Envelope, Heartbeat, Reply, Request
from ctlwire.transports.errors import MalformedFrame, OversizedFrame, PickleRefused

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
DEFAULT_MAX_MESSAGE_SIZE = 64 * 1024 * 1024


class PayloadTypeError(ValueError):
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

    def salvage_id(self, data: bytes | memoryview) -> int:
        """The request id of an undecodable frame, when it is readable; else 0.

        Lets an engine answer a malformed request with a typed error the caller
        can match, instead of leaving it to time out. Never raises.
        """
        if len(data) > self.max_message_size:
            return 0
        try:
            obj = self._decode_raw(data, Any)
        except Exception:
            return 0
        if isinstance(obj, list) and len(obj) >= 2 and obj[0] == "q" and type(obj[1]) is int:
            return int(obj[1])
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


class MsgpackCodec(_MsgspecCodec):
    """msgspec MessagePack (the default)."""

    name = "msgpack"
    _protocol: ClassVar[Any] = msgspec.msgpack


class JsonCodec(_MsgspecCodec):
    """msgspec JSON: human-readable frames, same validation."""

    name = "json"
    _protocol: ClassVar[Any] = msgspec.json


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
