"""Leaving ``async with`` from a cancelled scope, or because a sibling task failed,
closes every socket, the zmq context and the ipc files: on asyncio and on trio, for
every client transport, and for an engine that serves until it is cancelled."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.transports.zmq_client import (
    ZmqDealerClientTransport,
    ZmqPushPullClientTransport,
    ZmqRouterClientTransport,
)
from ctlwire.transports.zmq_client_base import _ZmqClientBase
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport, ZmqRouterEngineTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def _router(tmp: Path) -> _ZmqClientBase:
    return ZmqRouterClientTransport()  # a private ipc directory of its own


def _dealer(tmp: Path) -> _ZmqClientBase:
    return ZmqDealerClientTransport([f"ipc://{tmp}/engine.sock"])  # no engine there


def _push_pull(tmp: Path) -> _ZmqClientBase:
    return ZmqPushPullClientTransport([f"ipc://{tmp}/engine.sock"])


CLIENTS: dict[str, Callable[[Path], _ZmqClientBase]] = {
    "router": _router, "dealer": _dealer, "push-pull": _push_pull}


def _bound_files(transport: _ZmqClientBase) -> list[str]:
    """The socket files (and private directories) the transport bound."""
    out = []
    for address in (getattr(transport, "address", None),
                    getattr(transport, "reply_address", None)):
        if isinstance(address, str) and address.startswith("ipc://"):
            out += [address[len("ipc://"):], os.path.dirname(address[len("ipc://"):])]
    return out


def _assert_closed(transport: _ZmqClientBase, files: list[str]) -> None:
    assert transport.closed
    assert transport.context.closed, "the transport's own zmq context was left open"
    assert not [f for f in files if os.path.exists(f)], "ipc files left behind"


@pytest.fixture
def private_dir(tmp_path: Path) -> Path:
    os.chmod(tmp_path, 0o700)
    return tmp_path


@pytest.mark.parametrize("kind", list(CLIENTS))
async def test_a_client_left_from_a_cancelled_scope_closes_everything(
        kind: str, private_dir: Path) -> None:
    """Before, on trio: the transport's close awaited its task group's exit, which
    re-raised the cancellation, so the sockets, the context and the ipc file stayed
    (and a later garbage collection of the context could block the process)."""
    transport = CLIENTS[kind](private_dir)
    with anyio.move_on_after(0.2) as scope:
        async with ControlClient(transport, ranks=1) as client:
            files = _bound_files(transport)
            assert all(os.path.exists(f) for f in files)
            await client.wait_ready(timeout=10)
    assert scope.cancelled_caught
    assert client.closed
    _assert_closed(transport, files)


@pytest.mark.parametrize("kind", list(CLIENTS))
async def test_a_client_left_because_a_sibling_failed_closes_everything(
        kind: str, private_dir: Path) -> None:
    transport = CLIENTS[kind](private_dir)
    entered = anyio.Event()
    files: list[str] = []

    async def use_client() -> None:
        async with ControlClient(transport, ranks=1) as client:
            files.extend(_bound_files(transport))
            entered.set()
            await client.wait_ready(timeout=10)

    async def fail() -> None:
        await entered.wait()
        raise RuntimeError("sibling failed")

    with pytest.raises(BaseException) as info:
        async with anyio.create_task_group() as tg:
            tg.start_soon(use_client)
            tg.start_soon(fail)
    assert "sibling failed" in repr(info.value)
    _assert_closed(transport, files)


async def test_a_transport_left_alone_from_a_cancelled_scope_closes(private_dir: Path) -> None:
    transport = ZmqRouterClientTransport()
    with anyio.move_on_after(0.1):
        async with transport:
            files = _bound_files(transport)
            await anyio.sleep_forever()
    _assert_closed(transport, files)


@pytest.mark.parametrize("orientation", ["dealer", "router"])
async def test_an_engine_serving_until_cancelled_closes_everything(
        orientation: str, private_dir: Path) -> None:
    """An engine's ``serve()`` cancelled from outside (its beacon running) closes its
    sockets, its context and the socket files it bound."""
    address = f"ipc://{private_dir}/control.sock"
    transport: ZmqDealerEngineTransport | ZmqRouterEngineTransport
    if orientation == "dealer":
        transport = ZmqDealerEngineTransport(address, 0)
    else:
        transport = ZmqRouterEngineTransport(address, 0)
    endpoint = EngineEndpoint(transport, heartbeat_interval=0.05)
    with anyio.move_on_after(0.3) as scope:
        await endpoint.serve()
    assert scope.cancelled_caught
    assert transport.closed and transport.context.closed
    assert transport.beacon is None or not transport.beacon.running
    assert not os.path.exists(f"{private_dir}/control.sock")
    assert not os.path.exists(f"{private_dir}/control.sock.beat")
