"""The transports use the public APIs of anyio, asyncio, trio and pyzmq only: no private
module or name, no backend-specific wait, nothing a library upgrade may break silently."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TRANSPORTS = Path(__file__).resolve().parents[2] / "transports"

#: dotted names (and prefixes ending in ".") no transport module may use
FORBIDDEN = ("zmq.backend", "asyncio._", "trio._", "anyio._", "sniffio.", "trio.lowlevel.",
             "asyncio.get_running_loop", "asyncio.get_event_loop")


def dotted_names(tree: ast.AST) -> set[str]:
    """Every ``a.b.c`` attribute chain and every imported module or name in ``tree``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Attribute):
            parts = [node.attr]
            value = node.value
            while isinstance(value, ast.Attribute):
                parts.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name):
                parts.append(value.id)
                names.add(".".join(reversed(parts)))
    return names


def violations(source: str) -> list[str]:
    return sorted(name for name in dotted_names(ast.parse(source))
                  if any(name == bad.rstrip(".") or name.startswith(bad) for bad in FORBIDDEN))


@pytest.mark.parametrize("path", sorted(TRANSPORTS.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(TRANSPORTS)))
def test_module_uses_public_apis_only(path: Path) -> None:
    assert violations(path.read_text()) == []


@pytest.mark.parametrize("source", [
    "import zmq.backend", "from zmq.backend import Socket", "zmq.backend.Socket.send",
    "asyncio._get_running_loop()", "from anyio._core._eventloop import get_async_backend",
    "trio.lowlevel.notify_closing(fd)", "import sniffio\nsniffio.current_async_library()",
])
def test_the_check_finds_each_forbidden_use(source: str) -> None:
    assert violations(source)
