"""The library uses only the public APIs of anyio, trio, asyncio and pyzmq.

A private module or attribute (``anyio._core``, ``asyncio._get_running_loop``),
pyzmq's ``zmq.backend`` and ``trio.lowlevel.notify_closing`` (documented for
closing a descriptor, not as a wake-up) can change in any release. Every import,
attribute chain and ``getattr`` with a constant name in ``kernel/``,
``transports/`` and ``states/`` is read from the syntax tree (comments and
docstrings do not count) and resolved through the module's import aliases.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("kernel", "transports", "states")
GUARDED = frozenset({"anyio", "asyncio", "trio", "zmq"})
FORBIDDEN = ("zmq.backend", "trio.lowlevel.notify_closing")



def _is_private(dotted: str) -> bool:
    parts = dotted.split(".")
    return any(p.startswith("_") and not (p.startswith("__") and p.endswith("__"))
               for p in parts[1:])


def _forbidden(dotted: str) -> bool:
    if dotted.split(".")[0] not in GUARDED:
        return False
    return _is_private(dotted) or any(dotted == f or dotted.startswith(f + ".")
                                      for f in FORBIDDEN)


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """``a.b.c`` with its root resolved through the module's imports, or None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return None
    return ".".join([aliases[node.id], *reversed(parts)])


def violations(source: str) -> set[str]:
    """The forbidden names ``source`` uses: imported, reached by attribute or by
    ``getattr`` with a constant name."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}
    found: set[str] = set()
    for node in ast.walk(tree):  # imports anywhere: module level, functions, TYPE_CHECKING
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name)
                root = alias.name.split(".")[0]
                aliases[alias.asname or root] = alias.name if alias.asname else root
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            for alias in node.names:
                found.add(f"{node.module}.{alias.name}")
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:  # whole chains only
            dotted = _dotted(node, aliases)
            if dotted:
                found.add(dotted)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            dotted = _dotted(node.args[0], aliases)
            if dotted:
                found.add(f"{dotted}.{node.args[1].value}")
    return {name for name in found if _forbidden(name)}


def _library_violations() -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for package in LIBRARY:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            found |= {(rel, name) for name in violations(path.read_text())}
    return found


def test_the_library_uses_only_public_apis() -> None:
    assert _library_violations() == set()


def test_each_kind_of_private_use_is_found() -> None:
    source = '''
import asyncio
import zmq
import trio.lowlevel as tl
from anyio import _core
from anyio._core._eventloop import get_async_backend
from trio.lowlevel import notify_closing
import zmq.backend
"""asyncio._in_a_docstring"""
# trio._in_a_comment
def f(loop):
    asyncio._get_running_loop()
    zmq.backend.Socket.send(loop)
    tl.notify_closing(3)
    getattr(asyncio, "_private_by_name")
    asyncio.get_running_loop()      # public
    zmq.Socket.send(loop)           # public
    zmq.__version__                 # a dunder is public
    loop._private_of_our_own         # not one of the guarded libraries
'''
    assert violations(source) == {
        "anyio._core", "anyio._core._eventloop", "anyio._core._eventloop.get_async_backend",
        "trio.lowlevel.notify_closing", "zmq.backend", "zmq.backend.Socket.send",
        "asyncio._get_running_loop", "asyncio._private_by_name",
    }


# -- no probing, no reach-ins ---------------------------------------------------------
# The library asks the objects it is given only for what their types declare: no
# ``getattr``/``hasattr``/``inspect.signature`` probing of a client, a transport or a
# codec. What may be looked up by name, each for its reason:
ALLOWED_PROBES: dict[tuple[str, str], str] = {
    ("kernel/engine/method_table.py", "handler"): "a handler, read as it is registered",
    ("kernel/errors.py", "exc"): "an exception a handler raised: its optional ``code``",
    ("transports/_lazy_exports.py", "importlib.import_module(module)"): "a facade's export",
    ("transports/codec.py", "type(self)"): "its own class: is a method overridden below",
    ("transports/codec.py", "_MsgspecCodec"): "its own class: is a method overridden below",
}
#: code folders read for private access to another object (``other._x``)
EVERYWHERE = (*LIBRARY, "app", "testing", "conformance", "integrations", "benchmarks",
              "examples")
# Private names of another object that may be read, each for its reason:
ALLOWED_REACH_INS: dict[tuple[str, str], str] = {
    ("kernel/core/operation_core.py", "other"): "clone() filling in the copy it builds",
    ("kernel/engine/method_table.py", "sys"): "sys._getframe, documented",
    ("app/engine_process.py", "os"): "os._exit, documented",
    ("app/operation_engine.py", "os"): "os._exit, documented",
    ("app/torch_engine.py", "os"): "os._exit, documented",
}
PROBE_CALLS = frozenset({"getattr", "hasattr", "signature"})


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def probes(source: str) -> list[tuple[str, int]]:
    """(what is probed, line) of every ``getattr``/``hasattr``/``inspect.signature``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = (func.id if isinstance(func, ast.Name)
                    else func.attr if isinstance(func, ast.Attribute) else "")
            if name in PROBE_CALLS:
                found.append((ast.unparse(node.args[0]), node.lineno))
    return found


def reach_ins(source: str) -> list[tuple[str, int]]:
    """(whose private name is read, line): ``other._x`` and ``getattr(other, "_x")``;
    ``self``'s, ``cls``'s and ``super()``'s own names do not count."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and _private(node.args[1].value)):
            owner = node.args[0]
        else:
            continue
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if (isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name)
                and owner.func.id == "super"):
            continue
        found.append((ast.unparse(owner), node.lineno))
    return found


def _found(folders: tuple[str, ...], check: Callable[[str], list[tuple[str, int]]],
           allowed: dict[tuple[str, str], str]) -> list[str]:
    hits = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            hits += [f"{rel}:{line} {what}" for what, line in check(path.read_text())
                     if (rel, what) not in allowed]
    return hits


def test_the_library_probes_nothing_it_is_given() -> None:
    assert _found(LIBRARY, probes, ALLOWED_PROBES) == []


def test_no_code_reads_another_objects_private_names() -> None:
    assert _found(EVERYWHERE, reach_ins, ALLOWED_REACH_INS) == []


def test_every_allowance_is_still_needed() -> None:
    # a stale entry would let a new probe or reach-in through at its place
    for (rel, what) in ALLOWED_PROBES:
        assert (what in {w for w, _ in probes((ROOT / rel).read_text())}), (rel, what)
    for (rel, what) in ALLOWED_REACH_INS:
        assert (what in {w for w, _ in reach_ins((ROOT / rel).read_text())}), (rel, what)


def test_each_kind_of_probe_and_reach_in_is_found() -> None:
    assert probes("params = inspect.signature(client.fan_out).parameters") == [
        ("client.fan_out", 1)]
    assert probes("f = getattr(self.transport, 'batched_sends', None)\n"
                  "ok = hasattr(type(t), 'receive_many')") == [
        ("self.transport", 1), ("type(t)", 2)]
    assert probes("x = self.transport.batched_sends()") == []
    assert reach_ins("tombs = getattr(reg, '_tombstones', {})\n"
                     "assert harness._tg is None\n"
                     "fleet._spawn(rank)\n") == [("reg", 1), ("harness", 2), ("fleet", 3)]
    assert reach_ins("self._seq += 1\nsuper()._go(e)\nx = self.__class__\n"
                     "d = getattr(obj, '__dict__', None)") == []
