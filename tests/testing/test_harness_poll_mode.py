"""EngineHarness(mode="poll"): an engine's own step function and poll loop, in memory."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.testing import EngineHarness

pytestmark = pytest.mark.anyio


class Counter:
    """A busy-loop engine: each step advances ``steps`` unless paused."""

    def __init__(self) -> None:
        self.steps = 0
        self.paused = False
        self.handled_during_step = 0
        self._in_step = False

    def step(self) -> bool:
        if self.paused:
            return False
        self._in_step = True
        self.steps += 1
        self._in_step = False
        return True

    def register(self, ep: EngineEndpoint) -> Callable[[], bool]:
        @ep.method()
        def pause() -> int:
            self.handled_during_step += self._in_step
            self.paused = True
            return self.steps

        @ep.method()
        def resume() -> None:
            self.paused = False

        @ep.method()
        def steps() -> int:
            self.handled_during_step += self._in_step
            return self.steps

        return self.step


async def test_poll_mode_runs_the_engines_step_between_polls() -> None:
    engines: dict[int, Counter] = {}

    def setup(ep: EngineEndpoint) -> Callable[[], bool]:
        engines[len(engines)] = engine = Counter()
        return engine.register(ep)

    async with EngineHarness(ranks=2, setup=setup, mode="poll") as h:
        first = await h.client.call("steps", rank=0)
        await anyio.sleep(0.05)
        assert await h.client.call("steps", rank=0) > first  # the loop steps by itself
        at_pause = await h.client.call("pause", rank=1)
        await anyio.sleep(0.05)
        assert await h.client.call("steps", rank=1) == at_pause  # paused: no step ran
        await h.client.call("resume", rank=1)
        await anyio.sleep(0.05)
        assert await h.client.call("steps", rank=1) > at_pause
        assert all(e.handled_during_step == 0 for e in engines.values())  # between steps
        assert h.engines[0].metrics()["counters"]["replied"] >= 2


async def test_serve_mode_does_not_run_a_step() -> None:
    engine = Counter()
    async with EngineHarness(ranks=1, setup=engine.register) as h:
        await anyio.sleep(0.05)
        assert await h.client.call("steps", rank=0) == 0


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="mode"):
        EngineHarness(ranks=1, mode="threads")  # type: ignore[arg-type]
