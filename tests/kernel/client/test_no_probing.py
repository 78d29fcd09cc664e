"""The client side asks its transport only what ``ClientTransport`` declares, and
reaches into no other object.

Every method and attribute the kernel uses of a client transport is declared on
the abstract class (with a default where a transport may do without), so no
client-side module probes an object for what it has: no ``getattr``, ``hasattr``
or ``inspect.signature`` anywhere in them; and none reads another object's private
attribute (``other._x``: only ``self``'s, ``cls``'s and ``super()``'s). Read from the
syntax tree (docstrings do not count).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CLIENT_SIDE = (
    "kernel/client/*.py", "kernel/observability/metrics.py",
    "kernel/core/request_registry.py", "kernel/primitives/*.py", "transports/transport.py",
    "transports/memory.py", "transports/zmq_client*.py", "transports/zmq_per_rank_client.py",
    "transports/zmq_socket.py", "transports/task_waits.py", "testing/faults/*.py",
)
PROBES = frozenset({"getattr", "hasattr", "signature"})


def probes(source: str) -> list[str]:
    """The probing calls in ``source``: ``getattr``, ``hasattr``, ``inspect.signature``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = (func.id if isinstance(func, ast.Name)
                    else func.attr if isinstance(func, ast.Attribute) else "")
            if name in PROBES:
                found.append(ast.unparse(node))
    return found


def test_the_client_side_never_probes() -> None:
    files = sorted({p for pattern in CLIENT_SIDE for p in ROOT.glob(pattern)})
    assert len(files) > 20
    found = {str(p.relative_to(ROOT)): hits for p in files if (hits := probes(p.read_text()))}
    assert found == {}


def reach_ins(source: str) -> list[str]:
    """Where ``source`` reads a private attribute of an object other than its own."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if (isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name)
                    and owner.func.id == "super"):
                continue
            found.append(ast.unparse(node))
    return found


def test_the_client_side_reaches_into_no_other_object() -> None:
    files = sorted({p for pattern in CLIENT_SIDE for p in ROOT.glob(pattern)})
    found = {str(p.relative_to(ROOT)): hits for p in files if (hits := reach_ins(p.read_text()))}
    assert found == {}
    assert reach_ins("size = len(self.codec._encode(probe))") == ["self.codec._encode"]
    assert reach_ins("self._seq += 1\nsuper()._go(e)\nx = self.__class__") == []


def test_the_check_sees_a_probe() -> None:
    assert probes("f = getattr(self.transport, 'batched_sends', None)") == [
        "getattr(self.transport, 'batched_sends', None)"]
    assert probes("ok = hasattr(type(t), 'receive_many')")
    assert probes("p = inspect.signature(client.fan_out)")
    assert probes("x = self.transport.batched_sends()") == []
