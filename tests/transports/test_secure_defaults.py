"""Secure by default: tcp without CURVE (loopback included), an abstract ipc name
without CURVE and a CURVE ROUTER for engine ranks without keys bound to ranks are
refused at construction, on the client and the engine side, unless explicitly opted
into (``allow_insecure_tcp=True``, ``allow_abstract_ipc=True``, ``any_rank=True``)."""

from __future__ import annotations

import secrets
from collections.abc import Callable

import anyio
import pytest
import zmq

from ctlwire.app.engine_fleet import EngineFleet, EngineStartError
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.testing import free_tcp_address
from ctlwire.transports.curve import CurveServerConfig, KeyPair, RanksUnbound
from ctlwire.transports.zmq_client import (
    ZmqDealerClientTransport,
    ZmqPairClientTransport,
    ZmqPushPullClientTransport,
    ZmqRouterClientTransport,
)
from ctlwire.transports.zmq_config import (
    InsecureAbstractIpc,
    InsecureAddress,
    InsecureBind,
    InsecureTcp,
)
from ctlwire.transports.zmq_engine import (
    ZmqDealerEngineTransport,
    ZmqPairEngineTransport,
    ZmqPushPullEngineTransport,
    ZmqRouterEngineTransport,
)

pytestmark = [pytest.mark.timeout(180)]


def _constructors(address: str, option: str = "allow_insecure_tcp"
                  ) -> list[Callable[[bool], object]]:
    """Every transport class, ``address`` in each socket position it has; the opt-in
    ``option`` set to the constructor's argument."""
    ctx = zmq.Context.instance()
    other = "inproc://ctlwire-peer-auth-other"
    return [
        lambda ok: ZmqRouterClientTransport(address, **{option: ok}),
        lambda ok: ZmqDealerClientTransport([address], **{option: ok}),
        lambda ok: ZmqPushPullClientTransport([address], other, **{option: ok}),
        lambda ok: ZmqPushPullClientTransport([other], address, **{option: ok}),
        lambda ok: ZmqPairClientTransport([address], context=ctx, **{option: ok}),
        lambda ok: ZmqDealerEngineTransport(address, 0, **{option: ok}),
        lambda ok: ZmqRouterEngineTransport(address, 0, **{option: ok}),
        lambda ok: ZmqPushPullEngineTransport(address, other, 0, **{option: ok}),
        lambda ok: ZmqPushPullEngineTransport(other, address, 0, **{option: ok}),
        lambda ok: ZmqPairEngineTransport(address, 0, context=ctx, **{option: ok}),
    ]


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_tcp_without_curve_is_refused_at_construction_even_on_loopback(host: str) -> None:
    """Before: loopback tcp without CURVE was accepted silently on both sides, so any
    local process could speak for any rank. Now every class, client and engine, bind
    and connect, raises a typed error unless ``allow_insecure_tcp=True``."""
    address = free_tcp_address(host) if host != "localhost" else "tcp://localhost:5999"
    refused = 0
    for i, make in enumerate(_constructors(address)):
        with pytest.raises(InsecureTcp, match="allow_insecure_tcp"):
            transport = make(False)
            raise AssertionError(f"constructor {i} accepted {address}: {transport!r}")
        refused += 1
        transport = make(True)  # the explicit opt-in is honoured
        close = getattr(transport, "close", None)
        if close is not None:
            close()
    assert refused == 10
    with pytest.raises(InsecureBind):  # a bind says so
        ZmqRouterClientTransport(address)


def test_an_engine_process_refuses_insecure_tcp_unless_told() -> None:
    address = free_tcp_address()
    with pytest.raises(EngineStartError), EngineFleet(1, lambda r: ["--connect", address],
                                                      ready_timeout=60):
        pass
    with EngineFleet(1, lambda r: ["--connect", address, "--allow-insecure-tcp"],
                     ready_timeout=60) as fleet:
        assert fleet.engines[0].alive


def _abstract_name() -> str:
    return f"ipc://@ctlwire-test-{secrets.token_hex(6)}"


def test_an_abstract_ipc_name_is_refused_at_construction_unless_allowed() -> None:
    """Before: ``ipc://@name`` was accepted by every class, though it has no file and
    no permissions (any local user could connect and speak for any rank). Now every
    class, client and engine, bind and connect, raises a typed error naming the
    opt-in; ``allow_abstract_ipc=True`` is honoured; ``allow_insecure_tcp`` is not it."""
    address = _abstract_name()
    refused = 0
    for i, make in enumerate(_constructors(address, "allow_abstract_ipc")):
        with pytest.raises(InsecureAbstractIpc, match="allow_abstract_ipc=True"):
            transport = make(False)
            raise AssertionError(f"constructor {i} accepted {address}: {transport!r}")
        refused += 1
        transport = make(True)
        close = getattr(transport, "close", None)
        if close is not None:
            close()
    assert refused == 10
    for make in _constructors(address):  # the tcp opt-in does not open this door
        with pytest.raises(InsecureAbstractIpc):
            make(True)
    assert issubclass(InsecureAbstractIpc, InsecureAddress)
    assert issubclass(InsecureTcp, InsecureAddress)
    # under CURVE the peer is authenticated by its key, as on tcp
    server, k0 = (KeyPair(*zmq.curve_keypair()) for _ in range(2))
    curve = CurveServerConfig.allowing(server, ranks={0: k0.public})
    assert ZmqRouterClientTransport(address, curve=curve).curve is curve


def test_an_engine_process_refuses_an_abstract_ipc_name_unless_told() -> None:
    address = _abstract_name()
    with pytest.raises(EngineStartError), EngineFleet(1, lambda r: ["--connect", address],
                                                      ready_timeout=60):
        pass


@pytest.mark.anyio
async def test_an_abstract_ipc_name_opted_into_on_both_sides_carries_calls() -> None:
    address = _abstract_name()
    transport = ZmqRouterClientTransport(address, allow_abstract_ipc=True)
    async with ControlClient(transport, ranks=1, default_timeout=20.0) as client:
        with EngineFleet(1, lambda r: ["--connect", address, "--allow-abstract-ipc"],
                         ready_timeout=60):
            await client.wait_ready(timeout=60)
            assert await client.call("echo", "over @", rank=0) == "over @"
            await anyio.sleep(0)


def test_a_curve_router_for_ranks_requires_keys_bound_to_ranks() -> None:
    """Before: ``allowing(keys, [k0, k1])`` let rank 1's key speak as rank 0 (forged
    replies and heartbeats). Now the client's ROUTER requires ``ranks=`` or an explicit
    ``any_rank=True``; an engine's ROUTER (its peers are clients, not ranks) does not."""
    server, k0, k1 = (KeyPair(*zmq.curve_keypair()) for _ in range(3))
    address = "tcp://127.0.0.1:0"
    with pytest.raises(RanksUnbound, match="ranks="):
        ZmqRouterClientTransport(address, curve=CurveServerConfig.allowing(
            server, [k0.public, k1.public]))
    bound = CurveServerConfig.allowing(server, ranks={0: k0.public, 1: k1.public})
    assert ZmqRouterClientTransport(address, curve=bound).curve is bound
    anyone = CurveServerConfig.allowing(server, [k0.public, k1.public], any_rank=True)
    assert ZmqRouterClientTransport(address, curve=anyone).curve is anyone
    with pytest.raises(ValueError, match="any_rank"):
        CurveServerConfig.allowing(server, ranks={0: k0.public}, any_rank=True)
    ZmqRouterEngineTransport(free_tcp_address(), 0,
                             curve=CurveServerConfig.allowing(server, [k0.public])).close()
