"""Old paths of modules that moved keep working for the deprecation period
(``docs/versioning.md``): one table, :data:`MOVED`, and one import hook.

An old name imported (``import``, ``from … import``, a lazy import) is the module at
its new name -- the same module object, so the same classes and functions -- and
warns once, when first imported: a :class:`DeprecationWarning` naming the replacement.
``python -m <old name>`` runs the new module (a package: its ``__main__``) and warns
with a :class:`FutureWarning`, as a command does. A moved package takes its
sub-modules along (``ctlwire.kernel.testing.pytest_plugin`` is
``ctlwire.testing.pytest_plugin``); a module merged into another names that one.

The hook is installed when :mod:`ctlwire.transports` is first imported: every old
name lies under ``ctlwire.kernel`` or ``ctlwire.transports``, and importing either
package imports this one first. It lives in ``transports`` for that reason (as
:mod:`ctlwire.transports._lazy_exports` does); it reads the table as strings and
imports nothing it names until an old name is imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import CodeType, ModuleType

__all__ = ["MOVED", "REMOVED_IN", "install", "new_name"]

#: the first release that may remove the old names
REMOVED_IN = "0.3"

#: old dotted module name -> where it lives now (a package's sub-modules follow it)
MOVED: dict[str, str] = {
    # the command line, demos and example engines: around the library, not in it
    "ctlwire.kernel.app": "ctlwire.app",
    # test tooling, fault injection included
    "ctlwire.kernel.testing": "ctlwire.testing",
    "ctlwire.transports.testing": "ctlwire.testing.faults",
    # the conformance harness: a package of its own
    "ctlwire.transports.conformance": "ctlwire.conformance",
    "ctlwire.transports.conformance_client_check": "ctlwire.conformance.client_check",
    "ctlwire.transports.conformance_engine_check": "ctlwire.conformance.engine_check",
    "ctlwire.transports.conformance_frame_check": "ctlwire.conformance.frame_check",
    "ctlwire.transports.conformance_operation_check": "ctlwire.conformance.operation_check",
    "ctlwire.transports.conformance_report": "ctlwire.conformance.report",
    "ctlwire.transports.conformance_serving_check": "ctlwire.conformance.serving_check",
    "ctlwire.transports.conformance_wire": "ctlwire.conformance.wire",
    # the kernel's folders by purpose
    "ctlwire.kernel.operation_runner": "ctlwire.kernel.operations.runner",
    "ctlwire.kernel.operation_recovery": "ctlwire.kernel.operations.recovery",
    "ctlwire.kernel.step_dispatch": "ctlwire.kernel.operations.step_dispatch",
    "ctlwire.kernel.step_outcomes": "ctlwire.kernel.operations.step_outcomes",
    "ctlwire.kernel.ledger_reads": "ctlwire.kernel.operations.ledger_reads",
    "ctlwire.kernel.etcd_membership": "ctlwire.kernel.membership.etcd_membership",
    "ctlwire.kernel.etcd_registration": "ctlwire.kernel.membership.etcd_registration",
    "ctlwire.kernel.etcd_gateway": "ctlwire.kernel.membership.etcd_gateway",
    "ctlwire.kernel.metrics": "ctlwire.kernel.observability.metrics",
    "ctlwire.kernel.otel": "ctlwire.kernel.observability.otel",
    "ctlwire.kernel.tracing": "ctlwire.kernel.observability.tracing",
    "ctlwire.kernel.liveness_monitor": "ctlwire.kernel.client.liveness_monitor",
    "ctlwire.kernel.busy_loop": "ctlwire.kernel.engine.busy_loop",
    "ctlwire.kernel.builtin_methods": "ctlwire.kernel.engine.builtin_methods",
    "ctlwire.kernel.actor": "ctlwire.kernel.primitives.actor",
    # modules split off for size, back in the ones they belong to
    "ctlwire.kernel.core.tombstone": "ctlwire.kernel.core.request_registry",
    "ctlwire.kernel.core.fence_guard": "ctlwire.kernel.core.fencing",
}

_ROOTS = ("ctlwire.kernel.", "ctlwire.transports.")


def new_name(old: str) -> str | None:
    """Where the module once named ``old`` lives now; None if it did not move."""
    if not old.startswith(_ROOTS):
        return None
    head, tail = old, ""
    while "." in head:
        new = MOVED.get(head)
        if new is not None:
            return new + tail
        head, _, last = head.rpartition(".")
        tail = f".{last}{tail}"
    return None


def _warn(old: str, new: str, category: type[Warning], how: str) -> None:
    warnings.warn(f"{how} {old} is deprecated and will be removed in ctlwire "
                  f"{REMOVED_IN}; use {new}", category, stacklevel=3)


class _MovedModule(importlib.abc.Loader):
    """Loads an old name as the module at its new name."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # a placeholder; exec_module puts the real module in its place

    def exec_module(self, module: ModuleType) -> None:
        old = module.__name__
        _warn(old, self.new, DeprecationWarning, "importing")
        # the import system returns what sys.modules holds once this returns
        sys.modules[old] = importlib.import_module(self.new)

    def get_code(self, fullname: str) -> CodeType | None:
        """The new module's code, for ``python -m <old name>`` (runpy asks for it)."""
        _warn(fullname, self.new, FutureWarning, "python -m")
        spec = importlib.util.find_spec(self.new)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(f"{self.new}.__main__")
        if spec is None or not isinstance(spec.loader, importlib.abc.InspectLoader):
            raise ImportError(f"no code for {self.new}", name=fullname)
        return spec.loader.get_code(spec.name)


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old names of :data:`MOVED` (ahead of the path finders, so an old
    name never loads a second copy of a module)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new = new_name(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedModule(new))


_FINDER = _MovedModuleFinder()


def install() -> None:
    """Put the hook first on ``sys.meta_path`` (once per process)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
