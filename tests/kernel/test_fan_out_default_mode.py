"""A fan-out's default mode follows the method's kind: concurrent callers of a
read-only method share one in-flight request (``watching``); callers of any other
method queue, one request each (``queueing``); an explicit ``mode`` wins."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from ctlwire.kernel.core.fan_out_policy import MethodKinds
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.testing import EngineHarness

pytestmark = pytest.mark.anyio

CALLERS = 10


def setup(ep: EngineEndpoint) -> None:
    runs: list[str] = []
    release = anyio.Event()

    @ep.method(read_only=True)
    async def get_server_info() -> int:
        runs.append("info")
        await release.wait()
        return len(runs)

    @ep.method()
    async def bump() -> int:
        runs.append("bump")
        await release.wait()
        return len(runs)

    ep.runs = runs  # type: ignore[attr-defined]
    ep.release = release  # type: ignore[attr-defined]


async def callers(h: EngineHarness, method: str, **kwargs: Any) -> list[int]:
    """CALLERS concurrent fan-outs of ``method``, all admitted before the engine answers."""
    results: list[int] = []

    async def one() -> None:
        res = await h.client.fan_out(method, ranks=[0], timeout=10, **kwargs)
        results.append(res.results[0])

    async with anyio.create_task_group() as tg:
        for _ in range(CALLERS):
            tg.start_soon(one)
        await anyio.wait_all_tasks_blocked()
        h.engines[0].release.set()  # type: ignore[attr-defined]
    return results


def test_kinds_choose_the_default_mode() -> None:
    kinds = MethodKinds(["ctlwire.metrics"])
    assert kinds.default_mode("ctlwire.metrics") == "watching"
    assert kinds.default_mode("get_server_info") == "queueing"
    kinds.declare_read_only("get_server_info")
    assert kinds.default_mode("get_server_info") == "watching"


async def test_read_only_callers_share_one_request() -> None:
    async with EngineHarness(1, setup) as h:
        h.client.method_kinds.declare_read_only("get_server_info")
        results = await callers(h, "get_server_info")
        assert h.engines[0].runs == ["info"]  # type: ignore[attr-defined]
        assert results == [1] * CALLERS


async def test_state_changing_callers_queue_one_request_each() -> None:
    async with EngineHarness(1, setup) as h:
        results = await callers(h, "bump")
        assert h.engines[0].runs == ["bump"] * CALLERS  # type: ignore[attr-defined]
        assert sorted(results) == list(range(1, CALLERS + 1))


async def test_an_explicit_mode_wins() -> None:
    async with EngineHarness(1, setup) as h:
        h.client.method_kinds.declare_read_only("get_server_info")
        await callers(h, "get_server_info", mode="queueing")
        assert h.engines[0].runs == ["info"] * CALLERS  # type: ignore[attr-defined]
