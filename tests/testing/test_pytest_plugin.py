"""ctlwire's pytest plugin (kernel/pytest_plugin.py): its fixtures, the virtual
clock mark, the harness's quiet exit, and that an installed ctlwire provides it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from ctlwire.kernel import EngineEndpoint, RequestTimedOut
from ctlwire.testing import (
    VIRTUAL_HEARTBEAT_INTERVAL,
    EngineHarness,
    TransitionRecorder,
    on_virtual_clock,
)


def hang_methods(ep: EngineEndpoint) -> None:
    @ep.method()
    async def hang() -> None:
        await anyio.sleep(10_000)

    @ep.method()
    def get_load() -> int:
        return 0


@pytest.mark.ctlwire_virtual_clock
async def test_a_600_s_timeout_takes_milliseconds_of_real_time(
        ctlwire_harness: Any, transition_recorder: TransitionRecorder,
        anyio_backend: Any) -> None:
    assert on_virtual_clock()
    async with ctlwire_harness(ranks=2, setup=hang_methods) as h:
        assert h.heartbeat_interval == VIRTUAL_HEARTBEAT_INTERVAL  # heartbeats on, virtual
        real, virtual = time.perf_counter(), anyio.current_time()
        with pytest.raises(RequestTimedOut):
            await h.client.call("hang", rank=0, timeout=600)
        real, virtual = time.perf_counter() - real, anyio.current_time() - virtual
        # the engines kept beating all along: nobody was declared lost
        assert h.client.counters["heartbeats_received"] >= 2 * 600 / VIRTUAL_HEARTBEAT_INTERVAL
        assert h.client.counters["engine_lost"] == 0
    print(f"\n600 s timeout on {anyio_backend[0]} (virtual clock, heartbeats every "
          f"{VIRTUAL_HEARTBEAT_INTERVAL:g} virtual s): {virtual:.0f} virtual s in "
          f"{real * 1000:.1f} ms of real time")
    assert virtual == pytest.approx(600, abs=1)
    assert real < 0.3
    (rid,) = transition_recorder.ids("hang")
    transition_recorder.assert_path(rid, ["REGISTERED", "SENT", "AWAITING", "TIMED_OUT",
                                          "CLEANED"])


@pytest.mark.anyio
async def test_on_a_real_clock_the_harness_keeps_the_real_heartbeat(ctlwire_harness: Any) -> None:
    assert not on_virtual_clock()
    async with ctlwire_harness(setup=hang_methods) as h:
        assert h.heartbeat_interval == 0.25
        assert await h.client.call("get_load") == 0


@pytest.mark.ctlwire_virtual_clock
async def test_a_normal_harness_exit_is_not_reported_as_engines_lost(
        ctlwire_harness: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ctlwire")
    async with ctlwire_harness(ranks=3, setup=hang_methods) as h:
        assert await h.client.call("get_load", rank=2) == 0
    assert [r.getMessage() for r in caplog.records if "lost" in r.getMessage()] == []
    # a crash still is (the test can fail)
    async with EngineHarness(ranks=2, setup=hang_methods) as h:
        h.stop_engine(1)
        await anyio.sleep(0.01)
    lost = [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]
    assert lost == ["ctlwire: engine rank 1 lost (engine transport closed)"]


def test_the_mark_runs_on_both_backends_on_a_virtual_clock(request: pytest.FixtureRequest
                                                           ) -> None:
    names = sorted(item.name for item in request.session.items
                   if item.name.startswith("test_a_600_s_timeout"))
    if not names:
        pytest.skip("run with the rest of this module (it inspects the collected items)")
    assert names == ["test_a_600_s_timeout_takes_milliseconds_of_real_time[asyncio-virtual]",
                     "test_a_600_s_timeout_takes_milliseconds_of_real_time[trio-virtual]"]


PLUGIN_TEST = textwrap.dedent('''
    import anyio, pytest
    from ctlwire.kernel import RequestTimedOut

    def setup(ep):
        @ep.method()
        async def hang() -> None:
            await anyio.sleep(10_000)

    @pytest.mark.ctlwire_virtual_clock
    async def test_user(ctlwire_harness, transition_recorder):
        async with ctlwire_harness(ranks=2, setup=setup) as h:
            with pytest.raises(RequestTimedOut):
                await h.client.call("hang", rank=1, timeout=600)
        (rid,) = transition_recorder.ids("hang")
        transition_recorder.assert_path(
            rid, ["REGISTERED", "SENT", "AWAITING", "TIMED_OUT", "CLEANED"])
''')


def _pytest(tmp_path: Path, *args: str, autoload: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    if not autoload:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("autoload", [True, False], ids=["entry-point", "explicit-p"])
def test_a_project_that_installs_ctlwire_gets_the_fixtures(tmp_path: Path, autoload: bool
                                                           ) -> None:
    """A fresh directory with no conftest: the fixtures come from the installed
    plugin, found through the pytest11 entry point, or with -p when autoloading
    is off."""
    (tmp_path / "test_user.py").write_text(PLUGIN_TEST)
    extra = () if autoload else ("-p", "anyio", "-p", "ctlwire.testing.pytest_plugin")
    listed = _pytest(tmp_path, "--fixtures", *extra, autoload=autoload)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    for fixture in ("ctlwire_harness", "transition_recorder", "ctlwire_virtual_backend"):
        assert fixture in listed.stdout, listed.stdout
    ran = _pytest(tmp_path, "-q", "-W", "error::pytest.PytestUnknownMarkWarning", *extra,
                  autoload=autoload)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "2 passed" in ran.stdout, ran.stdout


# Runs pytest in a fresh interpreter in which trio is not installed, as far as
# imports and distribution metadata can tell: trio's module and its dist-info
# (whose entry points hypothesis would load) are hidden from the path finder.
WITHOUT_TRIO = textwrap.dedent('''
    import importlib.machinery, sys

    class PathFinderWithoutTrio(importlib.machinery.PathFinder):
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name == "trio" or name.startswith("trio."):
                return None
            return super().find_spec(name, path, target)

        @classmethod
        def find_distributions(cls, *args, **kwargs):
            for dist in super().find_distributions(*args, **kwargs):
                if (dist.metadata["Name"] or "").lower() != "trio":
                    yield dist

    sys.meta_path[:] = [PathFinderWithoutTrio if f is importlib.machinery.PathFinder else f
                        for f in sys.meta_path]
    import pytest
    sys.exit(pytest.main(sys.argv[1:]))
''')

NO_TRIO_TEST = PLUGIN_TEST + textwrap.dedent('''
    import importlib.util, sys

    def test_trio_is_not_installed_here():
        assert importlib.util.find_spec("trio") is None and "trio" not in sys.modules

    def test_virtual_backend_fixture(ctlwire_virtual_backend):
        assert ctlwire_virtual_backend[0] == "asyncio"
''')


def _pytest_without_trio(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "without_trio.py").write_text(WITHOUT_TRIO)
    (tmp_path / "test_user.py").write_text(NO_TRIO_TEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run([sys.executable, "without_trio.py", "-p", "no:cacheprovider",
                           "-q", "-rA", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


def test_without_trio_the_fixtures_run_on_asyncio(tmp_path: Path) -> None:
    """A project that installs ctlwire without trio: the plugin's fixtures and
    the virtual-clock mark run on asyncio only, with no collection error."""
    ran = _pytest_without_trio(tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "3 passed" in ran.stdout, ran.stdout
    assert "PASSED test_user.py::test_user[asyncio-virtual]" in ran.stdout, ran.stdout
    assert "PASSED test_user.py::test_virtual_backend_fixture[asyncio]" in ran.stdout
    assert "trio" not in ran.stdout.replace("test_trio_is_not_installed_here", "")


def test_choosing_a_backend_that_is_not_installed_is_a_usage_error(tmp_path: Path) -> None:
    ran = _pytest_without_trio(tmp_path, "--ctlwire-backends=asyncio,trio")
    assert ran.returncode == 4, ran.stdout + ran.stderr  # pytest's usage error
    assert "ctlwire_backends: ['trio'] not installed" in ran.stderr


@pytest.mark.parametrize("how", ["option", "ini"])
def test_a_user_chooses_the_backends(tmp_path: Path, how: str) -> None:
    (tmp_path / "test_user.py").write_text(PLUGIN_TEST)
    args: tuple[str, ...] = ("-q", "-rA")
    if how == "option":
        args += ("--ctlwire-backends", "trio")
    else:
        (tmp_path / "pytest.ini").write_text("[pytest]\nctlwire_backends = trio\n")
    ran = _pytest(tmp_path, *args)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "PASSED test_user.py::test_user[trio-virtual]" in ran.stdout, ran.stdout
    assert "asyncio-virtual" not in ran.stdout and "1 passed" in ran.stdout, ran.stdout
