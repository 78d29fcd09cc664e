"""Typed per-rank outcomes of an operation, on real engine processes, both backends.

Reports, progress events and quarantine records carry the same error objects a
fan-out gives (a remote error, a dead engine), not only their text.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.app.operation_engine import Fault, weight_update_plan
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.core.operation_result import ProgressEvent
from ctlwire.kernel.errors import EngineDead, RemoteError
from ctlwire.kernel.operations.runner import OperationRunner
from ctlwire.states import OperationState, RankState
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

N = 3
METHODS = "ctlwire.app.operation_engine:register"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[str]:
    os.chmod(tmp_path, 0o700)
    address = f"ipc://{tmp_path}/control.sock"
    with EngineFleet(N, lambda r: ["--connect", address, "--methods", METHODS]):
        yield address


async def test_reports_and_progress_carry_typed_errors(fleet: str) -> None:
    async with ControlClient(ZmqRouterClientTransport(fleet), ranks=N,
                             default_timeout=10.0) as c:
        await c.wait_ready(timeout=10)
        runner = OperationRunner(c)
        await c.call("arm_fault", Fault("update_weights"), rank=1)
        await c.call("arm_fault", Fault("update_weights", "crash"), rank=2)
        seen: list[ProgressEvent] = []
        result = await runner.run(weight_update_plan(1, 0), on_progress=seen.append)
        assert result.state is OperationState.DEGRADED, result.summary()
        assert result.ranks[0].error is None
        raised = result.ranks[1].error
        assert isinstance(raised, RemoteError) and raised.type_name == "InjectedFault"
        assert raised.rank == 1
        assert isinstance(result.ranks[2].error, EngineDead)  # killed: not a remote error
        assert not isinstance(result.ranks[2].error, RemoteError)
        failed = [e for e in seen if e.rank == 1 and e.state is RankState.FAILED]
        assert len(failed) == 1 and failed[0].error is raised
        lost = [e for e in seen if e.rank == 2 and e.state is RankState.UNKNOWN]
        assert len(lost) == 1 and isinstance(lost[0].error, EngineDead)
        assert runner.quarantined[2].error is result.ranks[2].error
