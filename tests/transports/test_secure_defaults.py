"""Secure by default: tcp without CURVE (loopback included) and a CURVE ROUTER for
engine ranks without keys bound to ranks are refused at construction, on the client
and the engine side, unless explicitly opted into (``allow_insecure_tcp=True``,
``any_rank=True``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import zmq

from ctlwire.kernel.app.engine_fleet import EngineFleet, EngineStartError
from ctlwire.kernel.testing import free_tcp_address
from ctlwire.transports.curve import CurveServerConfig, KeyPair, RanksUnbound
from ctlwire.transports.zmq_client import (
    ZmqDealerClientTransport,
    ZmqPairClientTransport,
    ZmqPushPullClientTransport,
    ZmqRouterClientTransport,
)
from ctlwire.transports.zmq_config import InsecureBind, InsecureTcp
from ctlwire.transports.zmq_engine import (
    ZmqDealerEngineTransport,
    ZmqPairEngineTransport,
    ZmqPushPullEngineTransport,
    ZmqRouterEngineTransport,
)

pytestmark = [pytest.mark.timeout(180)]


def _tcp_constructors(address: str) -> list[Callable[[bool], object]]:
    """Every transport class, ``address`` (tcp) in each socket position it has."""
    ctx = zmq.Context.instance()
    other = "inproc://ctlwire-peer-auth-other"
    return [
        lambda ok: ZmqRouterClientTransport(address, allow_insecure_tcp=ok),
        lambda ok: ZmqDealerClientTransport([address], allow_insecure_tcp=ok),
        lambda ok: ZmqPushPullClientTransport([address], other, allow_insecure_tcp=ok),
        lambda ok: ZmqPushPullClientTransport([other], address, allow_insecure_tcp=ok),
        lambda ok: ZmqPairClientTransport([address], context=ctx, allow_insecure_tcp=ok),
        lambda ok: ZmqDealerEngineTransport(address, 0, allow_insecure_tcp=ok),
        lambda ok: ZmqRouterEngineTransport(address, 0, allow_insecure_tcp=ok),
        lambda ok: ZmqPushPullEngineTransport(address, other, 0, allow_insecure_tcp=ok),
        lambda ok: ZmqPushPullEngineTransport(other, address, 0, allow_insecure_tcp=ok),
        lambda ok: ZmqPairEngineTransport(address, 0, context=ctx, allow_insecure_tcp=ok),
    ]


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_tcp_without_curve_is_refused_at_construction_even_on_loopback(host: str) -> None:
    """Before: loopback tcp without CURVE was accepted silently on both sides, so any
    local process could speak for any rank. Now every class, client and engine, bind
    and connect, raises a typed error unless ``allow_insecure_tcp=True``."""
    address = free_tcp_address(host) if host != "localhost" else "tcp://localhost:5999"
    refused = 0
    for i, make in enumerate(_tcp_constructors(address)):
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
