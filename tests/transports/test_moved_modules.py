"""Modules that moved keep their old names for the deprecation period.

Each old name (every entry of the table, and every sub-module of a moved package)
imports the same module object as the new one, warns once with a
DeprecationWarning naming the replacement, and ``python -m <old name>`` runs the
new module with a FutureWarning. The table and the docs' list of deprecated
names are the same.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from ctlwire.transports._moved_modules import MOVED, REMOVED_IN, new_name

ROOT = Path(__file__).resolve().parents[2]


def _old_and_new() -> Iterator[tuple[str, str]]:
    for old, new in sorted(MOVED.items()):
        yield old, new
        spec = importlib.util.find_spec(new)
        assert spec is not None, new
        for info in pkgutil.walk_packages(spec.submodule_search_locations or [], f"{new}."):
            if info.name.endswith("__main__"):
                continue  # runs on import; python -m is checked below
            if ".torch_" in info.name and importlib.util.find_spec("torch") is None:
                continue
            yield old + info.name[len(new):], info.name


OLD_AND_NEW = sorted(set(_old_and_new()))


def test_the_moved_names_cover_what_the_docs_name() -> None:
    olds = {old for old, _ in OLD_AND_NEW}
    assert len(olds) > 60
    assert {"ctlwire.kernel.testing", "ctlwire.kernel.testing.pytest_plugin",
            "ctlwire.kernel.testing.interleaving", "ctlwire.kernel.testing._harness",
            "ctlwire.kernel.app.engine_process", "ctlwire.kernel.app.torch_engine",
            "ctlwire.transports.testing._faults", "ctlwire.transports.conformance",
            "ctlwire.kernel.metrics", "ctlwire.kernel.operation_runner",
            "ctlwire.kernel.busy_loop", "ctlwire.kernel.otel"} <= olds


@pytest.mark.parametrize(("old", "new"), OLD_AND_NEW)
def test_an_old_name_imports_the_same_module_and_warns_once(
        old: str, new: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, old, raising=False)  # as in a process that never saw it
    expected = rf"^importing {re.escape(old)} is deprecated .* {REMOVED_IN}; use {re.escape(new)}$"
    with pytest.warns(DeprecationWarning, match=expected):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__name__ == new and module.__spec__ is not None
    assert module.__spec__.name == new
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert importlib.import_module(old) is module  # once: later imports are silent


def test_names_from_an_old_path_are_the_same_objects() -> None:
    with warnings.catch_warnings():  # warned once per process: maybe by a test above
        warnings.simplefilter("ignore", DeprecationWarning)
        from ctlwire.kernel.metrics import RequestMetrics
        from ctlwire.kernel.testing import EngineHarness, virtual_backend
        from ctlwire.transports.conformance import check_engine
        from ctlwire.transports.testing import FaultPlan
    import ctlwire.conformance
    import ctlwire.kernel
    import ctlwire.testing
    import ctlwire.testing.faults

    assert EngineHarness is ctlwire.testing.EngineHarness is ctlwire.kernel.EngineHarness
    assert virtual_backend is ctlwire.testing.virtual_backend
    assert FaultPlan is ctlwire.testing.faults.FaultPlan
    assert RequestMetrics is ctlwire.kernel.RequestMetrics
    assert check_engine is ctlwire.conformance.check_engine


def test_only_moved_names_are_redirected() -> None:
    assert new_name("ctlwire.kernel.errors") is None
    assert new_name("ctlwire.kernel.client.control_client") is None
    assert new_name("ctlwire.kernel.metricsx") is None
    assert new_name("ctlwire.testing") is None
    assert new_name("ctlwire.kernel.app.demo") == "ctlwire.app.demo"
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("ctlwire.kernel.no_such_module")
    with pytest.raises(ModuleNotFoundError), pytest.warns(DeprecationWarning):
        importlib.import_module("ctlwire.kernel.app.no_such_module")


@pytest.mark.parametrize(("old", "args", "new"), [
    ("ctlwire.kernel.app.engine_process", ["--help"], "ctlwire.app.engine_process"),
    ("ctlwire.kernel.app.cli", ["--version"], "ctlwire.app.cli"),
    ("ctlwire.transports.conformance", ["--help"], "ctlwire.conformance"),
    ("ctlwire.kernel.testing.operation_explorer", ["--help"],
     "ctlwire.testing.operation_explorer"),
])
def test_python_m_an_old_name_runs_the_new_module(old: str, args: list[str], new: str) -> None:
    def run(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", name, *args], capture_output=True,
                              text=True, timeout=60, check=False)

    moved, current = run(old), run(new)
    assert moved.returncode == current.returncode == 0, moved.stderr
    assert moved.stdout == current.stdout != ""
    assert f"FutureWarning: python -m {old} is deprecated" in moved.stderr
    assert f"use {new}" in moved.stderr
    assert "Warning" not in current.stderr


def test_python_m_an_old_package_runs_its_main() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ctlwire.kernel.testing.interleaving", "1", "1"],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "python -m ctlwire.kernel.testing.interleaving is deprecated" in done.stderr
    assert done.stdout.strip()


def test_the_docs_list_every_moved_name() -> None:
    versioning = (ROOT / "docs" / "versioning.md").read_text()
    listed = versioning.split("## Currently deprecated", 1)[1]
    for old, new in MOVED.items():
        assert f"`{old}`" in listed and f"`{new}`" in listed, old
