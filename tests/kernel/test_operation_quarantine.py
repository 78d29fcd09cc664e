"""The fleet's quarantine, on real engine processes over ipc, both backends.

A quarantined rank is held by the client, not by one runner: every fan-out
that does not name it leaves it out, every runner over the client sees it,
``rank_status`` and the metrics show it, and a restarted controller rebuilds
it from the engines' ledgers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.app.operation_engine import Fault, weight_update_plan
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.operations.runner import OperationRunner
from ctlwire.states import OperationState
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

N = 3
METHODS = "ctlwire.app.operation_engine:register"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[str, EngineFleet]]:
    os.chmod(tmp_path, 0o700)
    address = f"ipc://{tmp_path}/control.sock"
    with EngineFleet(N, lambda r: ["--connect", address, "--methods", METHODS]) as f:
        yield address, f


def client_for(address: str) -> ControlClient:
    return ControlClient(ZmqRouterClientTransport(address), ranks=N, default_timeout=10.0)


async def test_quarantine_holds_for_every_fan_out_and_survives_a_controller_restart(
        fleet: tuple[str, EngineFleet]) -> None:
    address, _ = fleet
    plan = weight_update_plan(1, 0, quarantine_on_error=True)
    async with client_for(address) as c:
        await c.wait_ready(timeout=10)
        await c.call("arm_fault", Fault("update_weights"), rank=1)
        result = await OperationRunner(c).run(plan)
        assert result.state is OperationState.DEGRADED and result.quarantined == (1,)
        # an ordinary fan-out, by anyone holding the client, leaves rank 1 out
        load = await c.fan_out("get_load", mode="concurrent")
        assert sorted(load.results) == [0, 2] and not load.errors
        assert OperationRunner(c).routable_ranks() == (0, 2)  # another runner sees it
        assert c.rank_status(1)["quarantined"] == {
            "op": result.op_id, "step": "update", "detail": result.ranks[1].detail}
        assert c.rank_status(0)["quarantined"] is None
        assert list(c.metrics()["quarantined"]) == [1]
        # naming it reaches it
        named = await c.fan_out("get_load", ranks=(0, 1, 2), mode="concurrent")
        assert sorted(named.results) == [0, 1, 2]
    async with client_for(address) as c2:  # the API server restarted
        await c2.wait_ready(timeout=10)
        runner = OperationRunner(c2)
        assert runner.routable_ranks() == (0, 1, 2)  # a new client knows nothing yet
        assert await runner.restore_quarantine(plan) == (1,)
        assert c2.quarantine.get(1) is not None and c2.quarantine.get(1).op_id == result.op_id
        load = await c2.fan_out("get_load", mode="concurrent")
        assert sorted(load.results) == [0, 2]
        # the committed and compensated ranks are not quarantined again
        assert await runner.restore_quarantine(plan) == ()
