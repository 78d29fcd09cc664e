"""Shared test configuration.

* Every async test runs on both anyio backends (asyncio and trio); modules that
  need virtual time override ``anyio_backend`` with ``virtual_backend``.
* After every test, every ControlClient the test created has an empty request
  map (nothing leaked, whatever path the test took).
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

from ctlwire.kernel.client.control_client import ControlClient


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
