"""Lazy re-exports for the package facades (``ctlwire.kernel``, ``ctlwire.transports``,
``ctlwire.kernel.testing``): a name is imported from its module on first use.

It lives in ``transports`` because that is the lowest layer every facade may
import (the kernel imports transports, never the reverse; importing ``states``
would load ``transitions`` and every state table). A facade keeps a static
``__all__`` and ``TYPE_CHECKING`` imports for type checkers, plus::

    __getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(namespace: dict[str, Any], exports: Mapping[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of a facade whose ``globals()``
    is ``namespace``; ``exports`` maps each exported name to its module."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *namespace["__all__"]})

    return __getattr__, __dir__
