"""Lazy re-exports for the package facades (``ctlwire.kernel``, ``ctlwire.transports``,
``ctlwire.testing``): a name is imported from its module on first use.

A facade lists each exported name once, in its ``if TYPE_CHECKING:`` block, as an
explicit re-export that type checkers and IDEs read::

    if TYPE_CHECKING:
        from ctlwire.transports.memory import MemoryClientTransport as MemoryClientTransport

    if not TYPE_CHECKING:
        __getattr__, __dir__ = lazy_exports(globals())

:func:`lazy_exports` reads that block from the facade's source and derives the
facade's ``__all__`` and its name -> module map (``_EXPORTS``) from it. Type
checkers see no module ``__getattr__``, so a misspelled name is an error there.

It lives in ``transports`` because that is the lowest layer every facade may
import (the kernel imports transports, never the reverse; importing ``states``
would load ``transitions`` and every state table).
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["exports_of", "lazy_exports"]


def exports_of(source: str) -> dict[str, str]:
    """Exported name -> defining module, read from the absolute ``from … import``
    statements of the module-level ``if TYPE_CHECKING:`` block of ``source``."""
    exports: dict[str, str] = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                and node.test.id == "TYPE_CHECKING"):
            continue
        for statement in node.body:
            if isinstance(statement, ast.ImportFrom) and statement.module and not statement.level:
                for alias in statement.names:
                    exports[alias.asname or alias.name] = statement.module
    return exports


def lazy_exports(namespace: dict[str, Any]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of a facade whose ``globals()`` is
    ``namespace``; sets the facade's ``__all__`` and ``_EXPORTS`` from its
    ``TYPE_CHECKING`` block."""
    package = namespace["__name__"]
    path = namespace.get("__file__")
    if not path:
        raise ImportError(f"{package}: its source is needed to read its exports", name=package)
    with open(path, encoding="utf-8") as source:  # any loader (pytest's rewriting one too)
        exports = exports_of(source.read())
    namespace["_EXPORTS"] = exports
    namespace["__all__"] = sorted(exports)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
