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
