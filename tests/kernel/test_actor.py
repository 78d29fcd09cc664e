"""The actor runtime: ordering, ask/tell, errors, backpressure, stop."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from ctlwire.kernel.errors import ActorStopped, AskTimeout
from ctlwire.kernel.primitives.actor import Actor, MailboxFull

# asyncio and trio, both on a virtual clock (ctlwire's pytest plugin)
pytestmark = [pytest.mark.anyio, pytest.mark.ctlwire_virtual_clock]


class Recorder(Actor[Any, Any]):
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.seen: list[Any] = []
        self.gate: anyio.Event | None = None
        self.tell_errors: list[Exception] = []

    async def handle(self, message: Any) -> Any:
        self.seen.append(message)
        if message == "block":
            self.gate = anyio.Event()
            await self.gate.wait()
        if message == "boom":
            raise ValueError("boom")
        if message == "sleep":
            await anyio.sleep(100)
        return f"ok:{message}"

    def on_tell_error(self, message: Any, error: Exception) -> None:
        self.tell_errors.append(error)


async def test_messages_are_handled_one_at_a_time_in_order() -> None:
    async with Recorder(mailbox_size=1000) as actor:
        for i in range(100):
            await actor.tell(i)
        assert await actor.ask("last") == "ok:last"
        assert actor.seen == [*range(100), "last"]
        assert actor.handled == 101


async def test_handler_exception_goes_to_the_asker_and_actor_survives() -> None:
    async with Recorder() as actor:
        with pytest.raises(ValueError, match="boom"):
            await actor.ask("boom")
        await actor.tell("boom")
        assert await actor.ask("after") == "ok:after"
        assert len(actor.tell_errors) == 1 and actor.failed == 2


async def test_tell_applies_backpressure_and_tell_nowait_raises_when_full() -> None:
    async with Recorder(mailbox_size=2) as actor:
        await actor.tell("block")
        await anyio.wait_all_tasks_blocked()
        actor.tell_nowait(1)
        actor.tell_nowait(2)
        with pytest.raises(MailboxFull):
            actor.tell_nowait(3)
        sent = []

        async def producer() -> None:
            await actor.tell(3)
            sent.append(3)

        async with anyio.create_task_group() as tg:
            tg.start_soon(producer)
            await anyio.wait_all_tasks_blocked()
            assert sent == []  # blocked by the full mailbox
            assert actor.gate is not None
            actor.gate.set()
        assert sent == [3]
        assert await actor.ask("x") == "ok:x"
        assert actor.seen == ["block", 1, 2, 3, "x"]


async def test_ask_timeout_is_typed_and_abandoned_asks_are_skipped() -> None:
    async with Recorder() as actor:
        await actor.tell("block")
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(AskTimeout):
            await actor.ask("never-run", timeout=5.0)
        assert actor.gate is not None
        actor.gate.set()
        assert await actor.ask("next") == "ok:next"
        assert "never-run" not in actor.seen
        assert actor.skipped == 1


async def test_stop_fails_every_queued_ask_with_actor_stopped() -> None:
    errors: list[BaseException] = []
    actor = Recorder()
    async with actor:

        async def asker(msg: str) -> None:
            try:
                await actor.ask(msg)
            except ActorStopped as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(asker, "sleep")
            await anyio.wait_all_tasks_blocked()
            for i in range(3):
                tg.start_soon(asker, f"q{i}")
            await anyio.wait_all_tasks_blocked()
            actor.stop()
    assert len(errors) == 4  # the one in hand and the three queued
    with pytest.raises(ActorStopped):
        await actor.tell("late")
    with pytest.raises(ActorStopped):
        await actor.ask("late")
    assert actor.stopped


async def test_actor_cannot_be_started_twice() -> None:
    actor = Recorder()
    async with actor:
        with pytest.raises(RuntimeError):
            await actor.__aenter__()
