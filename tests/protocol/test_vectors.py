"""The conformance vectors of ``protocol/vectors/``: this implementation encodes each
meaning to exactly its bytes, decodes the bytes to exactly that meaning, and refuses
the frames a receiver must refuse (see ``protocol_vector_cases.py`` for the format)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from protocol_vector_cases import CODEC, VECTORS, cases, envelope_of, meaning_of

from ctlwire.kernel.engine.operation_ledger import LastOperation, StepRequest, TakeOver
from ctlwire.transports.errors import MalformedFrame

LEDGER_TYPES: dict[str, type[msgspec.Struct]] = {
    "StepRequest": StepRequest, "LastOperation": LastOperation, "TakeOver": TakeOver}

FILES = sorted(VECTORS.glob("*.json"))
def load(path: Path) -> dict[str, Any]:
    vector: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return vector


def test_every_case_has_its_file_and_nothing_else() -> None:
    assert sorted(p.stem for p in FILES) == sorted(c["name"] for c in cases())
    kinds = {load(p)["meaning"]["kind"] for p in FILES if "meaning" in load(p)}
    assert kinds == {"request", "reply", "heartbeat", "value"}
    assert {load(p)["expect"] for p in FILES} == {"roundtrip", "decode", "reject"}


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_vector(path: Path) -> None:
    vector = load(path)
    data = bytes.fromhex(vector["hex"])
    expect = vector["expect"]
    if expect == "reject":
        with pytest.raises(MalformedFrame):
            CODEC.decode(data)
        assert CODEC.salvage_id(data) == vector["salvaged_id"]
        return
    meaning = vector["meaning"]
    if meaning["kind"] == "value":
        assert msgspec.msgpack.encode(meaning["fields"]) == data
        assert msgspec.msgpack.decode(data) == meaning["fields"]
        if "struct" in meaning:  # the ledger's own type encodes it the same way
            struct = LEDGER_TYPES[meaning["struct"]]
            assert msgspec.msgpack.encode(msgspec.msgpack.decode(data, type=struct)) == data
        return
    decoded = CODEC.decode(data)
    assert meaning_of(decoded) == meaning
    env = envelope_of(meaning)
    canonical = bytes.fromhex(vector.get("canonical_hex", vector["hex"]))
    assert CODEC.encode(env) == canonical
    fields = meaning["fields"]
    if vector["name"] == "reply-last-operation":  # the ledger's answer, as it encodes it
        answer = msgspec.msgpack.decode(bytes.fromhex(meaning["fields"]["result_hex"]),
                                        type=LastOperation)
        assert msgspec.msgpack.encode(answer).hex() == meaning["fields"]["result_hex"]
    if vector["name"] == "request-step":
        step = msgspec.msgpack.decode(bytes.fromhex(meaning["fields"]["payload_hex"]),
                                      type=StepRequest)
        assert msgspec.msgpack.encode(step).hex() == meaning["fields"]["payload_hex"]
    for name in ("payload", "result"):  # embedded values are the codec's own encoding
        if name + "_hex" in fields and fields[name + "_hex"]:
            assert bytes(CODEC.encode_value(fields[name])) == bytes.fromhex(fields[name + "_hex"])
    if expect == "roundtrip":
        assert canonical == data


def test_one_changed_byte_fails_a_vector() -> None:
    """The check above is byte-exact: a frame with one byte changed decodes to another
    meaning or not at all."""
    vector = load(VECTORS / "request-full.json")
    data = bytearray.fromhex(vector["hex"])
    for at in range(len(data)):
        changed = bytes(data[:at]) + bytes([data[at] ^ 0x01]) + bytes(data[at + 1:])
        try:
            decoded = CODEC.decode(changed)
        except MalformedFrame:
            continue
        assert meaning_of(decoded) != vector["meaning"], at


def test_the_largest_id_vector_holds_the_spec_s_largest_id() -> None:
    """The spec's id range is ``1 ≤ id < 2^64``: the vector of the largest id holds
    2**64 - 1, and the 64-bit one an id no signed 64-bit integer holds."""
    spec = (VECTORS.parents[1] / "docs" / "protocol.md").read_text(encoding="utf-8")
    assert "an id is `1 ≤ id < 2^64`" in spec
    assert load(VECTORS / "request-largest-id.json")["meaning"]["fields"]["id"] == 2**64 - 1
    assert load(VECTORS / "request-id-64-bits.json")["meaning"]["fields"]["id"] >= 2**63
