"""The module import graph of ctlwire's packages has no circle, and its imports point
one way: ``states`` <- ``transports`` <- ``kernel`` (the library) <- everything around it
(``app``, ``testing``, ``conformance``, ``integrations``, ``benchmarks``).

Every ``import`` in a module's source counts -- at module level, inside a
function (a lazy import) and under ``if TYPE_CHECKING:`` -- because each one
is a dependency a reader has to follow. The packages' ``__init__`` modules are
left out: they re-export names lazily (``_EXPORTS``, derived from their
``TYPE_CHECKING`` block, imported on first use), so
importing one deep module does not import its package's others. An import of
a name from a package (``from ctlwire.kernel import ControlClient``) is an
edge to the module that defines it.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

PACKAGES = ("ctlwire.kernel", "ctlwire.transports", "ctlwire.states", "ctlwire.integrations",
            "ctlwire.app", "ctlwire.testing", "ctlwire.conformance")

# Known edges that still close a circle. Empty: keep it so. An entry would have
# to name a real edge (checked below), and none may be added for new code.
KNOWN_CIRCLE_EDGES: frozenset[tuple[str, str]] = frozenset()


def _modules() -> tuple[dict[str, Path], set[str]]:
    """Every module of the packages (sub-packages included) -> its file; and the packages."""
    modules: dict[str, Path] = {}
    packages: set[str] = set()
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations
        for location in spec.submodule_search_locations:
            root = Path(location)
            for path in sorted(root.rglob("*.py")):
                parts = path.relative_to(root).with_suffix("").parts
                if parts[-1] == "__init__":
                    packages.add(".".join((package, *parts[:-1])))
                    continue
                modules[".".join((package, *parts))] = path
    return modules, packages


def _lazy_exports(package: str) -> dict[str, str]:
    exports = getattr(importlib.import_module(package), "_EXPORTS", None)
    return dict(exports) if isinstance(exports, dict) else {}


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _import_graph() -> dict[str, set[str]]:
    modules, packages = _modules()
    exports = {p: _lazy_exports(p) for p in packages}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(name, False, node)
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    if full in modules:
                        targets.add(full)
                    elif source in modules:
                        targets.add(source)
                    elif source in packages and alias.name in exports[source]:
                        targets.add(exports[source][alias.name])
        graph[name] = targets - {name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return _import_graph()


def test_the_graph_sees_every_kind_of_import(graph: dict[str, set[str]]) -> None:
    # a module-level import, a TYPE_CHECKING one and a lazy one inside a function
    assert "ctlwire.kernel.client.call_issuer" in graph["ctlwire.kernel.client.control_client"]
    assert "ctlwire.kernel.core.fan_out_result" in graph["ctlwire.kernel.errors"]  # TYPE_CHECKING
    metrics = "ctlwire.kernel.observability.metrics"
    assert metrics in graph["ctlwire.kernel.client.control_client"]  # lazy
    assert "ctlwire.kernel.core.request_registry" in graph[metrics]  # module level
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_mailbox_does_not_import_the_client(graph: dict[str, set[str]]) -> None:
    # the mailbox depends on its narrow FanOutSender interface, not on ControlClient
    mailbox = "ctlwire.kernel.client.fan_out_mailbox"
    assert "ctlwire.kernel.client.control_client" not in graph[mailbox]
    reachable, todo = set(), [mailbox]
    while todo:
        for w in graph[todo.pop()] - reachable:
            reachable.add(w)
            todo.append(w)
    assert "ctlwire.kernel.client.control_client" not in reachable


def test_the_client_parts_import_nothing_that_imports_the_client(
        graph: dict[str, set[str]]) -> None:
    client = "ctlwire.kernel.client.control_client"
    for part in ("client.call_issuer", "client.deadline_reaper", "client.liveness_monitor",
                 "client.fan_out_mailbox", "client.receiver", "client.rank_roster",
                 "core.peer_table", "core.request_registry"):
        assert client not in graph[f"ctlwire.kernel.{part}"], part


def test_the_sans_io_cores_import_no_io_and_no_shell(graph: dict[str, set[str]]) -> None:
    """``ctlwire.kernel.core`` is the sans-IO layer: no anyio, trio, asyncio or
    zmq, and nothing of the kernel but other cores and the error types."""
    modules, _ = _modules()
    cores = sorted(m for m in modules if m.startswith("ctlwire.kernel.core"))
    assert len(cores) >= 10
    io_roots = {"anyio", "trio", "asyncio", "zmq", "sniffio"}
    for name in cores:
        tree = ast.parse(modules[name].read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                roots = {node.module.split(".")[0]}
            else:
                continue
            assert not roots & io_roots, (name, roots)
        for target in graph[name]:
            if target.startswith("ctlwire.kernel"):
                assert (target.startswith("ctlwire.kernel.core")
                        or target == "ctlwire.kernel.errors"), (name, target)


def test_integrations_build_on_the_kernel_and_nothing_imports_them(
        graph: dict[str, set[str]]) -> None:
    """An integration (a drop-in for another stack) may import the kernel; the
    kernel, the transports and the states never import an integration."""
    integrations = {m for m in graph if m.startswith("ctlwire.integrations.")}
    assert "ctlwire.integrations.sglang" in integrations
    for name, targets in graph.items():
        if name not in integrations:
            assert not targets & integrations, (name, sorted(targets & integrations))
    assert "ctlwire.kernel.primitives.own_io_fan_out" in graph["ctlwire.integrations.sglang"]


def test_the_import_graph_has_no_circle(graph: dict[str, set[str]]) -> None:
    pruned = {v: {w for w in targets if (v, w) not in KNOWN_CIRCLE_EDGES}
              for v, targets in graph.items()}
    assert _circles(pruned) == []
    # an exception must still be needed: an edge that exists and, put back alone,
    # closes a circle (a stale entry would hide a new circle there)
    for v, w in KNOWN_CIRCLE_EDGES:
        assert w in graph[v], (v, w)
        assert _circles({**pruned, v: pruned[v] | {w}}), (v, w)


def test_metrics_imports_none_of_what_it_reads(graph: dict[str, set[str]]) -> None:
    # metrics reads a client, an endpoint and a runner through Protocols; each of
    # them imports metrics (or the built-in method names), never the other way
    metrics = "ctlwire.kernel.observability.metrics"
    for module in ("client.control_client", "engine.endpoint", "operations.runner"):
        assert f"ctlwire.kernel.{module}" not in graph[metrics], module
    assert graph["ctlwire.kernel.engine.builtin_methods"] == set()
    assert "ctlwire.kernel.observability.metrics" not in graph["ctlwire.kernel.engine.endpoint"]


def test_a_circle_is_found_where_one_is_put_back(graph: dict[str, set[str]]) -> None:
    # the check is not vacuous: the edge metrics -> control_client (the type hint
    # this file once excused) closes a circle with the client's lazy import
    assert _circles(graph) == []
    back = {v: set(targets) for v, targets in graph.items()}
    back["ctlwire.kernel.observability.metrics"].add("ctlwire.kernel.client.control_client")
    assert any({"ctlwire.kernel.observability.metrics", "ctlwire.kernel.client.control_client"}
               <= set(c) for c in _circles(back))


# third-party modules the packages may import without declaring them as dependencies:
# only inside a function that runs when the feature is used (an extra installs it),
# or at module level by the one module named (loaded only where it is installed)
OPTIONAL_IMPORTS: dict[str, tuple[str, frozenset[str]]] = {
    "trio": ("only on the trio backend, which needs trio installed to run", frozenset()),
    "graphviz": ("the diagrams extra (a state diagram rendered to an image)", frozenset()),
    "prometheus_client": ("the prometheus extra (the metrics exporter)", frozenset()),
    "opentelemetry": ("the tracing extra (OpenTelemetry spans)", frozenset()),
    "httpx": ("the etcd extra (membership through etcd's JSON gateway)", frozenset()),
    "pytest": ("the pytest plugin, loaded by pytest itself",
               frozenset({"ctlwire.testing.pytest_plugin"})),
    "torch": ("the torch extra (a real engine and its trainer, imported only by name)",
              frozenset({"ctlwire.app.torch_engine",
                         "ctlwire.app.torch_weight_sync",
                         "ctlwire.app.torch_model",
                         "ctlwire.app.torch_messages",
                         "ctlwire.app.torch_demo"})),
}


def _third_party_imports() -> dict[str, dict[str, bool]]:
    """Top-level third-party module -> {importing module: imported at module level}."""
    import sys

    modules, _packages = _modules()
    found: dict[str, dict[str, bool]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        top_level = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "ctlwire":
                    continue
                at_module_level = id(node) in top_level
                found.setdefault(top, {})
                found[top][module] = found[top].get(module, False) or at_module_level
    return found


def _declared_dependencies() -> set[str]:
    """The import names of the distributions pyproject.toml declares (not extras)."""
    import re
    from importlib.metadata import packages_distributions

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = Path(__file__).resolve().parents[1] / "pyproject.toml"
    deps = tomllib.loads(project.read_text())["project"]["dependencies"]
    dists = {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].lower().replace("_", "-")
             for d in deps}
    return {module for module, owners in packages_distributions().items()
            if any(o.lower().replace("_", "-") in dists for o in owners)}


def test_every_third_party_import_is_a_declared_dependency() -> None:
    # sniffio was imported but not declared: a plain install (anyio no longer pulls
    # it in) could not import ctlwire.kernel
    declared = _declared_dependencies()
    assert {"anyio", "zmq", "msgspec", "transitions", "sniffio"} <= declared
    for module, importers in _third_party_imports().items():
        if module in declared:
            continue
        assert module in OPTIONAL_IMPORTS, (module, sorted(importers))
        reason, allowed = OPTIONAL_IMPORTS[module]
        at_top = sorted(m for m, top in importers.items() if top and m not in allowed)
        assert not at_top, f"{module} ({reason}) imported at module level by {at_top}"


# The library's layers, innermost first, and the ctlwire packages each may import.
# Pure and synchronous states import nothing of ctlwire; transports move frames and
# know no request state; the kernel composes both. Nothing of the library imports
# what is built around it (app, testing, conformance, integrations, benchmarks).
MAY_IMPORT: dict[str, frozenset[str]] = {
    "states": frozenset({"states"}),
    "transports": frozenset({"transports"}),
    "kernel": frozenset({"kernel", "transports", "states"}),
}

# Names a library facade re-exports, lazily, from a package built around it: the
# tools users reach for beside the API (``from ctlwire.kernel import EngineHarness``).
# Loaded on first use only; no library module imports them.
FACADE_RE_EXPORTS: dict[str, frozenset[str]] = {
    "ctlwire.kernel": frozenset({"EngineFleet", "EngineProcess", "EngineStartError",
                                 "EngineHarness", "TransitionRecorder", "virtual_backend"}),
    "ctlwire.transports": frozenset({"FaultPlan", "FaultyClientTransport",
                                     "FaultyEngineTransport"}),
}


def _layer(module: str) -> str:
    return module.split(".")[1] if module.startswith("ctlwire.") else ""


def _ctlwire_imports(module: str, is_package: bool, source: str) -> set[str]:
    """Every ctlwire module or package ``source`` names in an import (lazy ones and
    those under ``if TYPE_CHECKING:`` included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add(_resolve(module, is_package, node))
    return {name for name in found if name.startswith("ctlwire.")}


def _wrong_way(imports: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs of library modules importing against the layers."""
    return sorted((module, target) for module, targets in imports.items()
                  for target in targets
                  if _layer(module) in MAY_IMPORT
                  and _layer(target) not in MAY_IMPORT[_layer(module)])


def _library_imports() -> dict[str, set[str]]:
    imports: dict[str, set[str]] = {}
    for package in ("ctlwire.states", "ctlwire.transports", "ctlwire.kernel"):
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations
        root = Path(next(iter(spec.submodule_search_locations)))
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            name = ".".join((package, *(parts[:-1] if is_package else parts)))
            targets = _ctlwire_imports(name, is_package, path.read_text())
            if is_package:  # a facade's lazy re-exports are checked on their own below
                exports = _lazy_exports(name)
                targets -= set(exports.values())
            imports[name] = targets
    return imports


def test_the_library_imports_point_one_way() -> None:
    imports = _library_imports()
    assert {"ctlwire.states.operation", "ctlwire.transports.codec",
            "ctlwire.kernel.client.control_client"} <= set(imports)
    assert _wrong_way(imports) == []


def test_a_library_facade_re_exports_from_outside_only_what_is_listed() -> None:
    for package in ("ctlwire.states", "ctlwire.transports", "ctlwire.kernel",
                    "ctlwire.kernel.primitives"):
        outside = {name for name, module in _lazy_exports(package).items()
                   if _layer(module) not in MAY_IMPORT[_layer(package)]}
        assert outside == FACADE_RE_EXPORTS.get(package, frozenset()), package


def test_an_import_against_the_layers_is_found() -> None:
    # the check is not vacuous: each kind of wrong-way import is reported
    wrong = {"ctlwire.states.operation": {"ctlwire.transports.codec"},
             "ctlwire.transports.codec": {"ctlwire.states.operation"},
             "ctlwire.kernel.errors": {"ctlwire.testing.faults", "ctlwire.transports.errors"},
             "ctlwire.kernel.engine.endpoint": {"ctlwire.benchmarks.fleets"}}
    assert _wrong_way(wrong) == [
        ("ctlwire.kernel.engine.endpoint", "ctlwire.benchmarks.fleets"),
        ("ctlwire.kernel.errors", "ctlwire.testing.faults"),
        ("ctlwire.states.operation", "ctlwire.transports.codec"),
        ("ctlwire.transports.codec", "ctlwire.states.operation")]
    lazy = "def f():\n    from ctlwire.app.cli import main\n"
    assert _ctlwire_imports("ctlwire.kernel.x", False, lazy) == {"ctlwire.app.cli"}
