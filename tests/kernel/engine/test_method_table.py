"""The method table alone: what registration records and what it refuses."""

from __future__ import annotations

import msgspec
import pytest

from ctlwire.kernel.engine.method_table import MethodTable
from ctlwire.transports.codec import MsgpackCodec


class Weights(msgspec.Struct):
    version: int


def test_registration_records_payload_type_and_how_the_method_runs() -> None:
    table = MethodTable(MsgpackCodec())

    @table.method(read_only=True)
    def info() -> str:
        return "x"

    @table.method(threaded=True, concurrency=3)
    def update(w: Weights) -> int:
        return w.version

    async def later(n: int = 2) -> int:
        return n

    table.register("later", later)
    specs = table.specs
    assert specs["info"].read_only and not specs["info"].takes_payload
    assert specs["update"].payload_type is Weights and specs["update"].threaded
    assert specs["update"].concurrency == 3 and not specs["update"].read_only
    assert specs["update"].decode is not None  # the codec's shortcut decoder
    assert specs["later"].is_async and specs["later"].payload_optional
    assert table.methods == ["info", "later", "update"]


def test_a_locally_defined_payload_type_resolves_in_the_registering_scope() -> None:
    table = MethodTable(MsgpackCodec())

    class Local(msgspec.Struct):
        n: int

    def handler(p: Local) -> int:  # a string annotation (from __future__)
        return p.n

    def both(p: tuple[Local, Weights]) -> int:  # a local name beside one of the module's
        return p[0].n

    table.register("h", handler)
    table.register("both", both)
    assert table.specs["h"].payload_type is Local
    assert table.specs["both"].payload_type == tuple[Local, Weights]


def test_what_registration_refuses() -> None:
    table = MethodTable(MsgpackCodec())
    table.register("a", lambda: None)
    with pytest.raises(ValueError, match="already registered"):
        table.register("a", lambda: None)
    with pytest.raises(ValueError, match="concurrency"):
        table.register("b", lambda: None, concurrency=0)
    with pytest.raises(TypeError, match="at most one argument"):
        table.register("c", lambda x, y: None)
    with pytest.raises(ValueError, match="non-empty"):
        table.register("", lambda: None)

    def unresolved(p: NoSuchType) -> None:  # type: ignore[name-defined] # noqa: F821
        pass

    with pytest.raises(TypeError, match="cannot resolve"):
        table.register("d", unresolved)
    assert table.methods == ["a"]
