"""Shared test configuration.

* Every async test runs on both anyio backends (asyncio and trio); modules that
  need virtual time override ``anyio_backend`` with ``virtual_backend``.
* After every test, every ControlClient the test created has an empty request
  map (nothing leaked, whatever path the test took), and every zmq Context the
  test created is closed (an open one is destroyed and the test fails: left to the
  garbage collector, a context with open sockets can block the process in
  ``Context.__del__``).
* After the session, no engine process, ipc socket file or private ipc
  directory made by ctlwire is left behind.
"""

from __future__ import annotations

import gc
import glob
import os
import tempfile
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from ctlwire.kernel.client.control_client import ControlClient


def _import_every_module() -> None:
    """Import every ctlwire module now, from this one thread, before any test starts
    one of its own. CPython 3.11 keeps the AST builder's recursion depth per
    interpreter, not per thread: a module compiled in one thread while another
    compiles one fails with ``SystemError: AST constructor recursion depth
    mismatch`` (python/cpython#106905). Modules first imported by a test (a fresh
    checkout has no bytecode yet) could otherwise meet a test's own threads."""
    import importlib
    import importlib.util
    import pkgutil

    import ctlwire

    for info in pkgutil.walk_packages(ctlwire.__path__, "ctlwire."):
        if info.name.endswith("__main__") or (
                ".torch_" in info.name and importlib.util.find_spec("torch") is None):
            continue
        importlib.import_module(info.name)


_import_every_module()


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def request_maps_are_empty_after_each_test(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    clients: weakref.WeakSet[ControlClient] = weakref.WeakSet()
    original = ControlClient.__init__

    def tracking_init(self: ControlClient, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        clients.add(self)

    monkeypatch.setattr(ControlClient, "__init__", tracking_init)
    yield
    leaked = {id(c): c.registry.live() for c in clients if c.registry.live_count}
    assert not leaked, f"request-map entries left behind: {leaked}"


#: every zmq Context made since the current test began (strong references: a context
#: left open is found here, not by the garbage collector at some later point)
_made_contexts: list[zmq.Context[Any]] = []


@pytest.fixture(autouse=True, scope="session")
def zmq_contexts_are_recorded() -> Iterator[None]:
    """Record each zmq Context as it is made (``zmq.Context`` and its subclasses,
    shadows excepted: they do not own what they wrap)."""
    original = zmq.Context.__init__

    def recording_init(self: zmq.Context[Any], *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if not (kwargs.get("shadow") or (args and not isinstance(args[0], int))):
            _made_contexts.append(self)

    zmq.Context.__init__ = recording_init  # type: ignore[method-assign]
    try:
        yield
    finally:
        zmq.Context.__init__ = original  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def zmq_contexts_are_closed_after_each_test(zmq_contexts_are_recorded: None) -> Iterator[None]:
    """A test ends with every zmq Context it made closed, the shared
    ``zmq.Context.instance()`` excepted (made by fixtures of a wider scope: not
    this test's)."""
    _made_contexts.clear()
    yield
    made = list(_made_contexts)
    _made_contexts.clear()
    if not made:
        return
    shared = zmq.Context.instance()
    left = [ctx for ctx in made if not ctx.closed and ctx is not shared]
    described = [repr(ctx) for ctx in left]
    for ctx in left:
        ctx.destroy(linger=0)
    assert not left, f"zmq contexts left open: {described}"


def _children() -> list[int]:
    me = str(os.getpid())
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            out.append(int(stat.split("/")[2]))
    return out


@pytest.fixture(autouse=True, scope="session")
def nothing_left_behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    # ctlwire's private ipc directories go to a folder of this session's own
    session_tmp = tmp_path_factory.mktemp("private-ipc")
    saved = tempfile.tempdir
    tempfile.tempdir = str(session_tmp)
    try:
        yield
    finally:
        tempfile.tempdir = saved
    gc.collect()  # transports that were never opened remove their directory when collected
    left = sorted(glob.glob(os.path.join(session_tmp, "ctlwire-*")))
    assert not left, f"private ipc directories left behind: {left}"
    if os.path.isdir("/proc"):
        assert not _children(), f"child processes left running: {_children()}"
