"""ipc safety is checked on the whole path: a private directory inside one that
another user can write (or owns) is refused with a typed error before any bind
or connect, so libzmq's reconnects can never be led to another user's socket.
Real directories, real sockets; both anyio backends where the client is
involved."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ctlwire.app.engine_fleet import EngineFleet, EngineStartError
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.transports.codec import PickleCodec
from ctlwire.transports.errors import PickleRefused
from ctlwire.transports.ipc_path import IpcPathUnsafe, directory_problem
from ctlwire.transports.zmq_client import ZmqDealerClientTransport, ZmqRouterClientTransport
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport, ZmqRouterEngineTransport

pytestmark = [pytest.mark.timeout(120)]

OTHER_UID = 65534  # nobody


@pytest.fixture
def shared_parent(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path/shared`` (mode 0777, not sticky) holding ``private`` (0700, ours)."""
    os.chmod(tmp_path, 0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    private = shared / "private"
    private.mkdir()
    os.chmod(private, 0o700)
    yield private
    os.chmod(shared, 0o700)


def test_a_private_directory_in_a_world_writable_one_is_refused_on_every_side(
        shared_parent: Path) -> None:
    """Binding or dialing a socket in a ``0700`` directory whose parent another
    user can write raises ``IpcPathUnsafe``; pickle there raises ``PickleRefused``
    at construction. Before, only the socket's own directory was checked."""
    address = f"ipc://{shared_parent}/ctl.sock"
    why = directory_problem(f"{shared_parent}/ctl.sock")
    print(f"\n{why}")
    assert why is not None and "not sticky" in why
    engine = ZmqDealerEngineTransport(address, 0)
    with pytest.raises(IpcPathUnsafe):
        engine.open()
    bound = ZmqRouterEngineTransport(address, 0)
    with pytest.raises(IpcPathUnsafe):
        bound.open()
    assert not os.path.exists(f"{shared_parent}/ctl.sock")
    with pytest.raises(PickleRefused):
        ZmqDealerEngineTransport(address, 0, codec=PickleCodec(allow_pickle=True))


@pytest.mark.anyio
async def test_a_client_dialing_through_a_world_writable_directory_is_refused(
        shared_parent: Path) -> None:
    address = f"ipc://{shared_parent}/engine.sock"
    with pytest.raises(IpcPathUnsafe):
        async with ControlClient(ZmqDealerClientTransport([address]), ranks=1):
            pass
    with pytest.raises(IpcPathUnsafe):
        async with ControlClient(ZmqRouterClientTransport(address), ranks=1):
            pass


def test_an_engine_process_refuses_to_dial_through_a_world_writable_directory(
        shared_parent: Path) -> None:
    """The engine process (the side that re-dials on its own) never opens: it
    exits before it is READY, saying why."""
    address = f"ipc://{shared_parent}/ctl.sock"
    fleet = EngineFleet(1, lambda r: ["--connect", address], ready_timeout=30)
    with pytest.raises(EngineStartError) as raised, fleet:
        pass
    print(f"\n{raised.value!r}")
    assert not os.path.exists(f"{shared_parent}/ctl.sock")


@pytest.mark.parametrize("setup", ["other_owner", "others_link", "group_writable"])
def test_other_unsafe_ancestors_are_refused(tmp_path: Path, setup: str) -> None:
    os.chmod(tmp_path, 0o700)
    parent = tmp_path / "p"
    parent.mkdir()
    os.chmod(parent, 0o755)
    private = parent / "private"
    private.mkdir()
    os.chmod(private, 0o700)
    path = f"{private}/s.sock"
    if setup == "other_owner":
        os.chown(parent, OTHER_UID, OTHER_UID)
    elif setup == "group_writable":
        os.chmod(parent, 0o775)
    else:
        link = tmp_path / "link"
        link.symlink_to(private)
        os.lchown(link, OTHER_UID, OTHER_UID)
        path = f"{link}/s.sock"
    why = directory_problem(path)
    print(f"\n{setup}: {why}")
    assert why is not None
    with pytest.raises(IpcPathUnsafe):
        ZmqRouterEngineTransport(f"ipc://{path}", 0).open()


@pytest.mark.anyio
async def test_a_sticky_shared_ancestor_is_accepted_and_serves(tmp_path: Path) -> None:
    """Like ``/tmp``: a world-writable but sticky parent of our own ``0700``
    directory is safe (others cannot rename what they do not own); a client and
    an engine talk through it, pickle included."""
    os.chmod(tmp_path, 0o700)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    private = sticky / "private"
    private.mkdir()
    os.chmod(private, 0o700)
    address = f"ipc://{private}/e.sock"
    assert directory_problem(f"{private}/e.sock") is None
    codec: Any = PickleCodec(allow_pickle=True)
    with EngineFleet(1, lambda r: ["--bind", address, "--codec", "pickle", "--allow-pickle"]):
        async with ControlClient(ZmqDealerClientTransport([address], codec=codec),
                                 ranks=1) as client:
            with anyio.fail_after(30):
                assert await client.call("echo", {"v": 1}, rank=0, timeout=20) == {"v": 1}
