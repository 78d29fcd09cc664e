"""A client whose CURVE key an engine refuses gets a typed error, and both
sides count it. Real ZeroMQ over tcp loopback, real time."""

from __future__ import annotations

import anyio
import pytest

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.errors import AuthenticationFailed, NotDelivered
from ctlwire.testing import free_tcp_address
from ctlwire.transports.curve import CurveClientConfig, CurveServerConfig, generate_keypair
from ctlwire.transports.zmq_client import ZmqDealerClientTransport
from ctlwire.transports.zmq_engine import ZmqRouterEngineTransport

pytestmark = pytest.mark.anyio




@pytest.mark.parametrize("allowed", [False, True])
async def test_a_client_refused_by_curve_gets_authentication_failed(allowed: bool) -> None:
    server, engine_allows, client_keys = generate_keypair(), generate_keypair(), generate_keypair()
    allow = [client_keys.public if allowed else engine_allows.public]
    address = free_tcp_address()
    engine = EngineEndpoint(ZmqRouterEngineTransport(
        address, 0, curve=CurveServerConfig.allowing(server, allow)))
    engine.register("echo", lambda x: x)
    transport = ZmqDealerClientTransport(
        [address], curve=CurveClientConfig(client_keys, server.public))
    async with anyio.create_task_group() as tg:
        await tg.start(engine.serve)
        async with ControlClient(transport, ranks=1) as client:
            if allowed:
                assert await client.call("echo", 7, rank=0, timeout=10) == 7
                assert client.metrics()["auth_failures"] == 0
            else:
                # called at once: waits for the handshake, then fails typed, not at 10 s
                with pytest.raises(AuthenticationFailed, match="refused this client's key"
                                   ) as info:
                    await client.call("echo", 7, rank=0, timeout=10)
                assert isinstance(info.value, NotDelivered) and info.value.retry_safe
                assert client.metrics()["auth_failures"] >= 1
                assert engine.metrics()["auth_rejections"] >= 1
        tg.cancel_scope.cancel()
