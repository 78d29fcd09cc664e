"""The public API: one obvious import, deep paths unchanged, every caller-visible
error in ctlwire.kernel.errors, no import cycles."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil
import re
import subprocess
import sys

import pytest

import ctlwire.kernel
import ctlwire.kernel.errors
import ctlwire.testing
import ctlwire.transports

PACKAGES = [ctlwire.kernel, ctlwire.transports, ctlwire.testing]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_every_exported_name_is_the_deep_paths_object(package: object) -> None:
    exports = package._EXPORTS  # type: ignore[attr-defined]
    assert sorted(exports) == sorted(package.__all__)  # type: ignore[attr-defined]
    for name, module in exports.items():
        deep = getattr(importlib.import_module(module), name)
        assert getattr(package, name) is deep, name
        assert name in dir(package)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_each_exported_name_is_listed_once(package: object) -> None:
    """The facade's ``TYPE_CHECKING`` block is its one list: no second list
    (``__all__``, a name -> module map) is written out beside it."""
    source = inspect.getsource(package)  # type: ignore[arg-type]
    tree = ast.parse(source)
    assigned = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(t, ast.Name)}
    assert not assigned & {"__all__", "_EXPORTS"}, assigned
    # __getattr__ is bound only when not type checking: a checker sees no catch-all,
    # so a misspelled name is an error there
    top = {n.id for node in tree.body if isinstance(node, ast.Assign)
           for n in ast.walk(node.targets[0]) if isinstance(n, ast.Name)}
    assert "__getattr__" not in top
    imported = [alias.asname or alias.name for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) for alias in node.names]
    for name in package.__all__:  # type: ignore[attr-defined]
        assert imported.count(name) == 1, name
        # listed as an explicit re-export (``X as X``), which mypy --strict and IDEs honour
        assert re.search(rf"\b{name} as {name}\b", source), name
        assert source.count(f'"{name}"') == 0, name


def test_the_exports_are_read_from_the_type_checking_block() -> None:
    from ctlwire.transports._lazy_exports import exports_of

    source = ("from typing import TYPE_CHECKING\nimport a\n"
              "if TYPE_CHECKING:\n    from m.x import (A as A,\n        b as b)\n"
              "    from m.y import C as C\n    from . import Rel\n"
              "def f():\n    if TYPE_CHECKING:\n        from m.z import D\n")
    assert exports_of(source) == {"A": "m.x", "b": "m.x", "C": "m.y"}


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_an_unknown_name_is_an_attribute_error(package: object) -> None:
    with pytest.raises(AttributeError, match="no_such_thing"):
        package.no_such_thing  # type: ignore[attr-defined]  # noqa: B018


def test_the_main_names_import_from_the_facades() -> None:
    from ctlwire.kernel import (  # noqa: F401
        AuthenticationFailed,
        ControlClient,
        EngineEndpoint,
        FanOutResult,
        Fenced,
        NotDelivered,
        OperationPlan,
        OperationRunner,
        OutcomeUnknown,
        RequestTooLarge,
        ResultTypeError,
        report_progress,
    )
    from ctlwire.transports import (  # noqa: F401
        CurveClientConfig,
        CurveServerConfig,
        MemoryNetwork,
        ZmqDealerEngineTransport,
        ZmqOptions,
        ZmqRouterClientTransport,
    )


def test_result_type_error_lives_with_the_other_errors_and_keeps_its_old_path() -> None:
    from ctlwire.kernel.client.control_client import ResultTypeError
    from ctlwire.kernel.primitives.actor import MailboxFull

    assert ResultTypeError is ctlwire.kernel.errors.ResultTypeError
    assert ResultTypeError.__module__ == "ctlwire.kernel.errors"
    assert MailboxFull is ctlwire.kernel.errors.MailboxFull
    assert issubclass(ResultTypeError, ctlwire.kernel.errors.CtlwireError)


# Where a CtlwireError may be defined outside kernel/errors.py: the errors an engine
# raises (they reach the client as RemoteError, by class name), the command line's,
# the etcd backend's and the test tools'. CtlwireError itself is the transports'.
ELSEWHERE = ("ctlwire.kernel.engine.", "ctlwire.app.", "ctlwire.testing.",
             "ctlwire.kernel.engine.busy_loop", "ctlwire.kernel.membership.",
             "ctlwire.kernel.core.inbound_core",  # Refused: what an engine handler raises
             "ctlwire.transports.")


def test_every_ctlwire_error_a_client_sees_is_defined_in_kernel_errors_and_exported() -> None:
    """Walk every kernel module: a CtlwireError subclass a client's caller can meet
    (the client's, an operation's, the cores') defined anywhere but kernel/errors.py
    fails this test, and so does one the package does not export."""
    found = set()
    for info in pkgutil.walk_packages(ctlwire.kernel.__path__, "ctlwire.kernel."):
        if info.name.endswith(("pytest_plugin", "__main__")):
            continue
        if ".torch_" in info.name and importlib.util.find_spec("torch") is None:
            continue  # the torch extra is not installed
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if (issubclass(obj, ctlwire.kernel.errors.CtlwireError)
                    and not obj.__module__.startswith(ELSEWHERE)):
                assert obj.__module__ == "ctlwire.kernel.errors", (obj, info.name)
                found.add(obj.__name__)
    assert {"InvalidPlan", "PostConditionFailed", "ReleaseRefused", "UnknownMethod"} <= found
    assert len(found) >= 20
    assert found <= set(ctlwire.kernel.__all__), found - set(ctlwire.kernel.__all__)


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_states_stay_pure_and_the_packages_import_lazily() -> None:
    out = _run("import sys, ctlwire.states, ctlwire.kernel, ctlwire.transports\n"
               "print(sorted(m for m in sys.modules if m.startswith(('ctlwire.', 'zmq'))))")
    assert "ctlwire.kernel.client.control_client" not in out  # nothing imported before use
    assert "'zmq'" not in out
    out = _run("import sys, ctlwire.states\n"
               "print([m for m in sys.modules if m.startswith(('ctlwire.kernel', "
               "'ctlwire.transports', 'anyio', 'zmq'))])")
    assert out.strip() == "[]"
    _run("from ctlwire.kernel import *\nfrom ctlwire.transports import *\n")


def test_engine_process_still_runs_as_a_module_without_a_double_import() -> None:
    # runpy warns (RuntimeWarning, an error here) when the package already imported it
    out = subprocess.run([sys.executable, "-W", "error", "-m", "ctlwire.app.engine_process",
                          "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--rank" in out.stdout


def test_every_metrics_exporter_is_importable_from_the_facade() -> None:
    import ctlwire.kernel.observability.metrics

    exporters = [n for n in ctlwire.kernel.observability.metrics.__all__ if n.endswith("Exporter")]
    assert {"PrometheusExporter", "EnginePrometheusExporter"} <= set(exporters)
    for name in exporters:
        assert getattr(ctlwire.kernel, name) is getattr(ctlwire.kernel.observability.metrics, name)
        assert name in ctlwire.kernel.__all__


def test_the_version_is_the_installed_distributions() -> None:
    from importlib.metadata import version

    assert ctlwire.kernel.__version__ == version("ctlwire")


def test_the_states_facade_exports_every_name_it_binds() -> None:
    import types

    import ctlwire.states

    exported = set(ctlwire.states.__all__)
    assert {"MACHINES", "TABLES", "PeerState", "derive_table", "IllegalTransition"} <= exported
    assert not exported & {"types", "annotations", "control_request"}
    for name in exported:
        assert not isinstance(getattr(ctlwire.states, name), types.ModuleType), name
