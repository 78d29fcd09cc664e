"""Every exception ctlwire raises on purpose is a ``CtlwireError``.

Two walks over the library, so that a new error outside the hierarchy fails here:

* every exception class defined in ``ctlwire.kernel``, ``ctlwire.transports`` and
  ``ctlwire.states`` (every module imported) is a ``CtlwireError`` -- an argument
  error may be a ``ValueError``/``TypeError`` as well -- except the few named below,
  each with why;
* every ``raise`` of a built-in exception in the source raises one of the built-ins
  that mean a programming error or a protocol's own exception (a bad argument, a
  missing key, misuse, an abstract method), never a plain ``Exception``.

An engine's exception becomes the client's ``RemoteError`` by its class name, so the
engine-side errors are held to the same rule: an application catching ``CtlwireError``
around ctlwire's calls on either side catches every one of them.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

from ctlwire.kernel import CtlwireError, RemoteError, UnknownMethod
from ctlwire.kernel.errors import remote_error
from ctlwire.transports.envelope import ErrorInfo

ROOT = Path(__file__).resolve().parent.parent
#: the library and what is built around it in this distribution
PACKAGES = ("ctlwire.kernel", "ctlwire.transports", "ctlwire.states", "ctlwire.app",
            "ctlwire.testing", "ctlwire.conformance")
FOLDERS = ("kernel", "transports", "states", "app", "testing", "conformance")

# Not CtlwireErrors, on purpose. ctlwire.states imports nothing of ctlwire (it is pure):
# its IllegalTransition means a kernel bug, its DiagramUnavailable a missing optional
# extra (a RuntimeError). The test tools' violations are AssertionErrors (a failed check,
# reported by pytest as one).
OUTSIDE = {
    "ctlwire.states.errors.IllegalTransition",
    "ctlwire.states.diagram.DiagramUnavailable",
}

# Built-ins a raise site may use: a bad argument or lookup, misuse of an object
# (RuntimeError: entered twice, already started), an abstract method, a broken
# invariant, an exit code, a module's __getattr__, a test tool's missing file or port.
# A plain Exception (or BaseException) is never one of them.
BUILTINS_ALLOWED = {"ValueError", "TypeError", "KeyError", "AttributeError", "ImportError",
                    "NotImplementedError", "AssertionError", "RuntimeError", "SystemExit",
                    "OSError", "FileNotFoundError"}


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        pkg = importlib.import_module(package)
        names.append(package)
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, package + ".")
                  if m.name.rsplit(".", 1)[-1] != "__main__"]
    return names


def _exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in _modules():
        module = importlib.import_module(name)  # an optional extra missing: a failure here
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == name:
                found[f"{name}.{obj.__qualname__}"] = obj
    return found


def test_every_exception_class_is_a_ctlwire_error() -> None:
    classes = _exception_classes()
    assert len(classes) >= 60, sorted(classes)  # the walk found the library's errors
    assert "ctlwire.kernel.errors.ReleaseRefused" in classes
    outside = sorted(name for name, cls in classes.items()
                     if not issubclass(cls, CtlwireError) and name not in OUTSIDE
                     and not issubclass(cls, AssertionError))
    assert outside == [], f"not CtlwireError subclasses: {outside}"
    assert set(classes) >= OUTSIDE  # each exception still exists
    for name in OUTSIDE:
        assert not issubclass(classes[name], CtlwireError), f"{name}: drop it from OUTSIDE"


def _raised_builtins() -> list[tuple[str, int, str]]:
    sites = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Raise) or node.exc is None:
                    continue
                target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(target, ast.Name) and hasattr(builtins, target.id):
                    sites.append((str(path.relative_to(ROOT)), node.lineno, target.id))
    return sites


def test_no_raise_site_raises_a_plain_exception() -> None:
    sites = _raised_builtins()
    assert any(name == "ValueError" for _, _, name in sites)  # the walk sees raise sites
    wrong = [site for site in sites if site[2] not in BUILTINS_ALLOWED]
    assert wrong == [], f"raise a CtlwireError (or an argument error) instead: {wrong}"


def test_the_walk_finds_a_plain_exception(tmp_path: Path) -> None:
    # the check is not vacuous: both spellings of a plain Exception are seen
    tree = ast.parse("raise Exception('x')\nraise BaseException\n")
    names = [n.exc.func.id if isinstance(n.exc, ast.Call) else n.exc.id  # type: ignore[union-attr]
             for n in ast.walk(tree) if isinstance(n, ast.Raise)]
    assert set(names) - BUILTINS_ALLOWED == {"Exception", "BaseException"}


@pytest.mark.parametrize("name", ["ReleaseRefused", "PostConditionFailed", "InvalidPlan",
                                  "UnknownMethod", "EngineStartError", "Unroutable"])
def test_the_errors_a_user_meets_are_importable_and_ctlwire_errors(name: str) -> None:
    import ctlwire.kernel
    import ctlwire.transports

    cls = getattr(ctlwire.kernel, name, None) or getattr(ctlwire.transports, name)
    assert issubclass(cls, CtlwireError)


def test_unknown_method_is_a_remote_error_with_the_engines_methods() -> None:
    err = remote_error(ErrorInfo("UnknownMethod", "no control method 'x' on this engine", 404),
                       rank=2, method="x", methods=("pause", "resume"))
    assert isinstance(err, UnknownMethod) and isinstance(err, RemoteError)
    assert (err.methods, err.rank, err.method, err.code) == (("pause", "resume"), 2, "x", 404)
    # an engine that does not send its methods: none known
    old = remote_error(ErrorInfo("UnknownMethod", "no control method 'x' on this engine", 404))
    assert isinstance(old, UnknownMethod) and old.methods is None
    # the same name with another code is the handler's own exception
    assert type(remote_error(ErrorInfo("UnknownMethod", "mine", 0))) is RemoteError


@pytest.mark.anyio
async def test_an_engine_lists_its_methods_when_asked_for_another() -> None:
    from ctlwire.kernel import EngineEndpoint, EngineHarness

    def setup(ep: EngineEndpoint) -> None:
        ep.register("pause", lambda: None)
        ep.register("resume", lambda: None)

    async with EngineHarness(ranks=2, setup=setup) as h:
        with pytest.raises(UnknownMethod) as info:
            await h.client.call("puase", rank=1, timeout=10)
        res = await h.client.fan_out("puase", timeout=10)
    assert info.value.rank == 1 and info.value.method == "puase"
    assert {"pause", "resume", "ctlwire.metrics"} <= set(info.value.methods or ())
    assert list(info.value.methods or ()) == sorted(info.value.methods or ())
    assert all(isinstance(e, UnknownMethod) and e.methods == info.value.methods
               for e in res.errors.values()) and sorted(res.errors) == [0, 1]
