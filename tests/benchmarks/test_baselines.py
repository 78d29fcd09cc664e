"""The bench's baselines work on both backends: the FD-technique client and the
Lock + Event fan-out communicator, against real bare pyzmq engine processes."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from ctlwire.benchmarks.baseline_lock_fanout import LockFanOutCommunicator
from ctlwire.benchmarks.baseline_pyzmq import PyzmqUtilityClient, RemoteCallError
from ctlwire.benchmarks.fleets import FleetPool

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
ENGINES = 3


@pytest.fixture(scope="module")
def engines() -> Iterator[str]:
    with FleetPool() as pool:
        pool.baseline("base", ENGINES)
        pool.start("base")
        yield pool.address("base")


async def test_calls_get_their_own_replies_and_errors(engines: str) -> None:
    async with PyzmqUtilityClient(engines) as client:
        await client.wait_ready(range(ENGINES), timeout=20)
        results: dict[int, object] = {}

        async def one(i: int) -> None:
            results[i] = await client.call(i % ENGINES, "echo", {"i": i})

        async with anyio.create_task_group() as tg:
            for i in range(300):
                tg.start_soon(one, i)
        assert results == {i: {"i": i} for i in range(300)}
        with pytest.raises(RemoteCallError, match="KeyError"):
            await client.call(0, "no_such_method")


async def test_fan_outs_queued_at_once_each_get_every_rank(engines: str) -> None:
    async with PyzmqUtilityClient(engines) as client:
        await client.wait_ready(range(ENGINES), timeout=20)
        comm = LockFanOutCommunicator(client, "echo", range(ENGINES))
        answers: list[dict[int, object]] = []

        async def one(i: int) -> None:
            answers.append({r: v for r, v in (await comm(i)).items() if v == i})

        async with anyio.create_task_group() as tg:
            for i in range(200):
                tg.start_soon(one, i)
        assert len(answers) == 200
        assert all(set(a) == set(range(ENGINES)) for a in answers)
