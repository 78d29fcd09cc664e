"""OwnIoFanOut under random schedules of calls, replies, cancellations, deadlines, resets
and a close (seeded, both backends, virtual time): replies never cross requests, requests
go out one at a time in arrival order, and nothing is left behind."""

from __future__ import annotations

import random
from typing import Any

import anyio
import pytest

from ctlwire.kernel import (
    ClientClosed,
    FanOutFailed,
    OutcomeUnknown,
    OwnIoFanOut,
    RequestTimedOut,
)
from ctlwire.testing import virtual_backend

pytestmark = pytest.mark.anyio

SLOTS = 2


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return virtual_backend(request.param)


class World:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.sent: list[str] = []
        self.fan: OwnIoFanOut[str] = OwnIoFanOut(self.send, SLOTS)
        self.arrived: list[str] = []
        self.outcome: dict[str, str] = {}
        self.scopes: dict[str, anyio.CancelScope] = {}
        self.replies_for: dict[str, int] = {}  # replies delivered per request sent
        self.given_up: set[str] = set()  # requests reset() gave up on

    def send(self, name: str) -> None:
        flight = self.fan.in_flight
        assert flight is not None and self.sent.count(name) == 0, name
        # the one before it is drained (or given up on) before this one goes out
        if self.sent:
            previous = self.sent[-1]
            assert self.replies_for[previous] >= SLOTS or previous in self.given_up, previous
        self.sent.append(name)
        self.replies_for[name] = 0

    async def call(self, name: str, timeout: float) -> None:
        scope = self.scopes[name] = anyio.CancelScope()
        with scope:
            try:
                result = await self.fan.call(name, timeout=timeout)
            except RequestTimedOut as exc:
                self.outcome[name] = "admission timeout" if exc.admission else "timed out"
                if exc.partial is not None:
                    self.check_values(name, exc.partial.results)
                return
            except ClientClosed:
                self.outcome[name] = "closed"
                return
            except FanOutFailed as exc:  # reset() before any reply: every slot given up
                assert all(isinstance(e, OutcomeUnknown) for e in exc.result.errors.values())
                assert name in self.given_up
                self.outcome[name] = "given up"
                return
            if result.errors:
                assert all(isinstance(e, OutcomeUnknown) for e in result.errors.values())
                assert name in self.given_up
                self.outcome[name] = "given up"
            else:
                self.outcome[name] = "ok"
            self.check_values(name, result.results)
            return
        self.outcome[name] = "cancelled"

    def check_values(self, name: str, values: dict[int, Any]) -> None:
        assert all(v == f"{name}/{slot}" for slot, v in values.items()), (name, values)

    def deliver(self) -> None:
        flight = self.fan.in_flight
        name = self.sent[-1] if flight is not None else None
        if name is None:
            self.fan.deliver("nobody's")
            return
        slot = self.replies_for[name]
        self.replies_for[name] += 1  # before: the last reply sends the next request
        self.fan.deliver(f"{name}/{slot}")

    def check(self) -> None:
        # sends follow arrival order, skipping calls that ended before their turn
        positions = [self.arrived.index(n) for n in self.sent]
        assert positions == sorted(positions), (self.arrived, self.sent)
        assert self.fan.registry.live_count <= len(self.arrived)
        assert (self.fan.in_flight is None) == (not self.fan.queue.busy)


@pytest.mark.parametrize("seed", range(12))
async def test_random_schedules_keep_every_guarantee(seed: int) -> None:
    w = World(seed)
    async with anyio.create_task_group() as tg:
        for i in range(30):
            action = w.rng.choice(["call", "call", "reply", "reply", "reply", "cancel",
                                   "sleep", "reset"])
            if action == "call":
                name = f"c{i}"
                w.arrived.append(name)
                tg.start_soon(w.call, name, w.rng.choice([0.5, 2.0, 30.0]))
            elif action == "reply":
                w.deliver()
            elif action == "cancel":
                waiting = [n for n in w.arrived if n not in w.outcome]
                if waiting:
                    w.scopes[w.rng.choice(waiting)].cancel()
            elif action == "sleep":
                await anyio.sleep(w.rng.choice([0.1, 1.0]))
            elif action == "reset" and w.fan.in_flight is not None:
                w.given_up.add(w.sent[-1])
                w.fan.reset()
            await anyio.wait_all_tasks_blocked()
            w.check()
        w.fan.close()
    w.check()
    assert set(w.outcome) == set(w.arrived)
    for name in w.arrived:  # a call never sent never got a result
        if name not in w.sent:
            assert w.outcome[name] in ("cancelled", "admission timeout", "closed"), name
    assert w.fan.registry.live_count == 0 and w.fan.depth == 0 and not w.fan.queue.busy
