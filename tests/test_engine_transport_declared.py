"""The engine side asks a transport only for what :class:`EngineTransport` declares.

* No probing: the engine's modules never look a member up by name (``getattr``,
  ``hasattr``) nor read a signature (``inspect.signature``), except on the
  handlers they register -- read from the syntax tree.
* Every member the engine's modules read from a transport (``transport.X``,
  ``self.transport.X``) is a member of the base class.
* Every engine transport of the library derives from it, and one that implements
  only its three abstract methods is served: the defaults are built on them.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.envelope import Reply, Request
from ctlwire.transports.errors import TransportClosed
from ctlwire.transports.memory import MemoryEngineTransport
from ctlwire.transports.testing import FaultyEngineTransport
from ctlwire.transports.transport import EngineTransport, Received
from ctlwire.transports.zmq_engine import (
    ZmqDealerEngineTransport,
    ZmqPairEngineTransport,
    ZmqPushPullEngineTransport,
    ZmqRouterEngineTransport,
)

ROOT = Path(__file__).resolve().parents[1]
ENGINE_SIDE = sorted([*(ROOT / "kernel" / "engine").glob("*.py"),
                      ROOT / "kernel" / "busy_loop.py",
                      ROOT / "kernel" / "core" / "inbound_core.py",
                      ROOT / "kernel" / "core" / "inbound_request.py"])
PROBES = frozenset({"getattr", "hasattr", "signature"})
#: (module, what is probed): the handlers an engine registers, read as they register
HANDLER_PROBES = frozenset({("method_table.py", "handler"), ("operation_ledger.py", "fn"),
                            ("busy_loop.py", "fn")})


def probes(path: Path) -> list[str]:
    """The probing calls of ``path`` that are not of a registered handler."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in PROBES and (path.name, ast.unparse(node.args[0])) not in HANDLER_PROBES:
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def transport_members(path: Path) -> set[str]:
    """The attributes ``path`` reads from a transport (``transport.X``, ``self.transport.X``)."""
    members = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            value = node.value
            owner = value.attr if isinstance(value, ast.Attribute) else getattr(value, "id", "")
            if owner == "transport":
                members.add(node.attr)
    return members


def test_the_engine_side_probes_no_transport() -> None:
    assert [p for path in ENGINE_SIDE for p in probes(path)] == []


def test_the_probe_check_finds_a_probe(tmp_path: Path) -> None:
    module = tmp_path / "endpoint.py"
    module.write_text("import inspect\nstart = getattr(transport, 'start_beacon', None)\n"
                      "takes = inspect.signature(transport.receive_one)\n")
    assert len(probes(module)) == 2


def test_every_member_read_from_a_transport_is_declared() -> None:
    declared = set(dir(EngineTransport)) | set(EngineTransport.__annotations__)
    read = set().union(*(transport_members(path) for path in ENGINE_SIDE))
    assert {"receive_one", "send_encoded_nowait", "start_beacon"} <= read
    assert read - declared == set()


@pytest.mark.parametrize("cls", [ZmqDealerEngineTransport, ZmqRouterEngineTransport,
                                 ZmqPushPullEngineTransport, ZmqPairEngineTransport,
                                 MemoryEngineTransport, FaultyEngineTransport])
def test_every_engine_transport_derives_from_the_base(cls: type[Any]) -> None:
    assert issubclass(cls, EngineTransport)


class ThreeMethods(EngineTransport):
    """A transport of the three abstract methods only."""

    def __init__(self) -> None:
        self.codec = MsgpackCodec()
        self.rank = 0
        self.inbox: list[Any] = []
        self.sent: list[tuple[Any, bytes]] = []

    def try_receive(self) -> Any:
        return self.inbox.pop(0) if self.inbox else None

    async def receive(self) -> Any:
        raise TransportClosed("polled only")

    def send_encoded_nowait(self, route: Any, data: bytes) -> None:
        self.sent.append((route, data))


def test_a_transport_of_the_abstract_methods_alone_is_served() -> None:
    transport = ThreeMethods()
    ep = EngineEndpoint(transport, heartbeat_interval=0.01)
    ep.register("echo", lambda v: v, payload_type=int)
    codec = transport.codec
    transport.inbox.append(Received(Request(1, 0, "echo", codec.encode_value(7)), route=b"r"))
    assert ep.poll() == 1
    replies = [(route, codec.decode(data)) for route, data in transport.sent]
    assert [(route, r.id, r.ok) for route, r in replies if isinstance(r, Reply)] == [
        (b"r", 1, True)]
    assert any(route is None for route, _ in replies)  # an in-band heartbeat: no beacon
    metrics = ep.metrics()
    assert metrics["beacon"] is False and metrics["redials"] == 0
    assert metrics["connections"] == {"open": 0, "refused": 0}
    assert metrics["beacon_refused"] == {"routes": 0, "frames": 0}
    assert transport.receive_one(0.0) is None
    with pytest.raises(NotImplementedError):
        transport.receive_one(0.01)  # it cannot block a thread: no wait_readable
