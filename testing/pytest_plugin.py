"""ctlwire's pytest plugin: fixtures for state-transition tests of your own engine.

Installed with ctlwire and loaded by pytest through the ``pytest11`` entry point
(as anyio ships its own), so a project that depends on ctlwire has these in
every test without a conftest (``-p ctlwire.testing.pytest_plugin`` loads it
explicitly when plugin autoloading is off; ``-p no:ctlwire`` turns it off):

``transition_recorder``
    a fresh :class:`~ctlwire.testing.TransitionRecorder`.
``ctlwire_harness``
    a factory of :class:`~ctlwire.testing.EngineHarness` (same
    arguments), observed by the test's ``transition_recorder`` unless you pass
    ``observer=``; heartbeats follow the clock (``heartbeat_interval="auto"``:
    0.25 s on a real clock, :data:`~ctlwire.testing.VIRTUAL_HEARTBEAT_INTERVAL`
    on a virtual one). Every harness it made must have been exited by the end
    of the test, and every request it recorded must have reached Cleaned.
``ctlwire_virtual_backend``
    each chosen backend on a virtual clock, as an ``anyio_backend`` value
    (see below).

Backends: the plugin runs on every anyio backend that is installed (asyncio
always, trio when it is importable: trio is optional), or on the ones you
choose with ``--ctlwire-backends=asyncio`` on the command line or
``ctlwire_backends = asyncio trio`` in the pytest ini file. Choosing a backend
that is not installed is a usage error, not a skipped test.

Virtual time: mark a test (or a module, with ``pytestmark``) with
``@pytest.mark.ctlwire_virtual_clock`` and it runs on asyncio and on trio, both
on a virtual clock (trio's ``MockClock`` with autojump; an asyncio loop whose
clock jumps to the next timer), on each chosen backend: a 600 s timeout takes milliseconds. The mark
implies ``@pytest.mark.anyio``. Heartbeats run on the same virtual clock::

    import pytest

    @pytest.mark.ctlwire_virtual_clock
    async def test_hung_engine_times_out(ctlwire_harness, transition_recorder):
        async with ctlwire_harness(ranks=2, setup=register_my_methods) as h:
            with pytest.raises(RequestTimedOut):
                await h.client.call("hang", rank=0, timeout=600)
        (rid,) = transition_recorder.ids("hang")
        transition_recorder.assert_path(
            rid, ["REGISTERED", "SENT", "AWAITING", "TIMED_OUT", "CLEANED"])
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ctlwire.testing import EngineHarness, TransitionRecorder

__all__ = ["VIRTUAL_CLOCK_MARK", "ctlwire_harness", "ctlwire_virtual_backend",
           "transition_recorder"]

VIRTUAL_CLOCK_MARK = "ctlwire_virtual_clock"
KNOWN_BACKENDS = ("asyncio", "trio")
_backends: tuple[str, ...] = KNOWN_BACKENDS  # set by pytest_configure


def installed_backends() -> tuple[str, ...]:
    """The anyio backends that can run here: asyncio, and trio when it is importable."""
    return tuple(b for b in KNOWN_BACKENDS
                 if b == "asyncio" or importlib.util.find_spec(b) is not None)


def _chosen_backends(config: pytest.Config) -> tuple[str, ...]:
    text = config.getoption("ctlwire_backends", None) or " ".join(
        config.getini("ctlwire_backends"))
    if not text:
        return installed_backends()
    chosen = tuple(dict.fromkeys(b for b in text.replace(",", " ").split() if b))
    unknown = [b for b in chosen if b not in KNOWN_BACKENDS]
    if unknown:
        raise pytest.UsageError(f"ctlwire_backends: unknown backend(s) {unknown}; "
                                f"choose from {list(KNOWN_BACKENDS)}")
    missing = [b for b in chosen if b not in installed_backends()]
    if missing:
        raise pytest.UsageError(f"ctlwire_backends: {missing} not installed "
                                f"(pip install {' '.join(missing)})")
    return chosen


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ctlwire")
    group.addoption("--ctlwire-backends", dest="ctlwire_backends", default=None,
                    metavar="NAMES", help="anyio backends for ctlwire's fixtures and "
                    "virtual-clock tests, comma-separated (default: every installed one)")
    parser.addini("ctlwire_backends", type="args", default=[],
                  help="anyio backends for ctlwire's fixtures (default: every installed one)")


def pytest_configure(config: pytest.Config) -> None:
    global _backends
    _backends = _chosen_backends(config)
    config.addinivalue_line(
        "markers", f"{VIRTUAL_CLOCK_MARK}: run this anyio test on each installed (or chosen) "
        "backend, on a virtual clock (ctlwire's pytest plugin); implies the anyio mark")


def selected_backends() -> tuple[str, ...]:
    """The backends this session runs ctlwire's fixtures and marked tests on."""
    return _backends


@pytest.hookimpl(tryfirst=True)  # before anyio's own hook looks for its mark
def pytest_pycollect_makeitem(collector: pytest.Module | pytest.Class, name: str,
                              obj: object) -> None:
    if not (collector.istestfunction(obj, name) and inspect.iscoroutinefunction(obj)):
        return
    marks = [m.name for m in getattr(obj, "pytestmark", ())]
    if VIRTUAL_CLOCK_MARK in marks or collector.get_closest_marker(VIRTUAL_CLOCK_MARK):
        if "anyio" not in marks and not collector.get_closest_marker("anyio"):
            pytest.mark.anyio(obj)
        pytest.mark.usefixtures("anyio_backend")(obj)


@pytest.hookimpl(tryfirst=True)  # before the fixture manager parametrizes the fixture
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "ctlwire_virtual_backend" in metafunc.fixturenames:
        metafunc.parametrize("ctlwire_virtual_backend", list(_backends), indirect=True,
                             ids=list(_backends))
    if (metafunc.definition.get_closest_marker(VIRTUAL_CLOCK_MARK) is None
            or "anyio_backend" not in metafunc.fixturenames):
        return  # not marked, or not an async test (a module's mark covers sync ones too)
    # direct parametrization overrides any anyio_backend fixture (anyio's, a conftest's);
    # values are made here, per test function, so each gets its own virtual clock
    from ctlwire.testing import virtual_backend

    metafunc.parametrize("anyio_backend", [virtual_backend(b) for b in _backends],
                         ids=[f"{b}-virtual" for b in _backends])


@pytest.fixture
def ctlwire_virtual_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """An ``anyio_backend`` value on a fresh virtual clock, for each chosen backend.
    Use as ``def anyio_backend(ctlwire_virtual_backend): return ctlwire_virtual_backend``
    to put a whole module on virtual time (or mark tests ``ctlwire_virtual_clock``)."""
    from ctlwire.testing import virtual_backend

    return virtual_backend(str(getattr(request, "param", _backends[0])))


@pytest.fixture
def transition_recorder() -> TransitionRecorder:
    """A fresh recorder of ControlRequest transitions (``.ids()``, ``.path()``,
    ``.assert_path()``, ``.assert_all_cleaned()``)."""
    from ctlwire.testing import TransitionRecorder

    return TransitionRecorder()


@pytest.fixture
def ctlwire_harness(transition_recorder: TransitionRecorder
                    ) -> Iterator[Callable[..., EngineHarness]]:
    """``ctlwire_harness(ranks=1, setup=None, **kwargs)`` -> an
    :class:`~ctlwire.testing.EngineHarness` to ``async with``; see the
    module docstring."""
    from ctlwire.testing import EngineHarness

    made: list[EngineHarness] = []

    def make(ranks: int = 1, setup: Callable[..., object] | None = None,
             **kwargs: Any) -> EngineHarness:
        kwargs.setdefault("observer", transition_recorder)
        kwargs.setdefault("heartbeat_interval", "auto")
        harness = EngineHarness(ranks, setup, **kwargs)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        assert not harness.running, "an EngineHarness from ctlwire_harness was not exited"
    if made:
        transition_recorder.assert_all_cleaned()
