"""The waiter of a request only its caller waits on (``ControlClient.call``):
``loop_native.single_waiter_factory`` -- a bare future on asyncio, the task
parked and rescheduled on trio. Same contract as the loop's event for one task."""

from __future__ import annotations

import anyio
import pytest

from ctlwire.kernel.loop_native import single_waiter_factory

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def test_set_wakes_the_waiting_task_once_and_a_later_wait_returns() -> None:
    waiter = single_waiter_factory()()
    woke: list[bool] = []

    async def wait() -> None:
        await waiter.wait()
        woke.append(waiter.is_set())

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        assert woke == [] and not waiter.is_set()
        waiter.set()
        waiter.set()  # idempotent
    assert woke == [True]
    with anyio.fail_after(1):
        await waiter.wait()  # already set: returns


async def test_a_cancelled_wait_leaves_nothing_parked_and_a_later_set_is_harmless() -> None:
    waiter = single_waiter_factory()()
    with anyio.move_on_after(0.05) as scope:
        await waiter.wait()
    assert scope.cancelled_caught
    waiter.set()  # the cancelled task is not rescheduled (trio would raise if it were)
    assert waiter.is_set()
    await anyio.sleep(0.01)
    with anyio.fail_after(1):
        await waiter.wait()


async def test_set_before_the_wait_needs_no_wake() -> None:
    waiter = single_waiter_factory()()
    waiter.set()
    with anyio.fail_after(1):
        await waiter.wait()
    assert waiter.is_set()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_on_trio_a_wait_after_set_is_still_a_checkpoint() -> None:
    waiter = single_waiter_factory()()
    waiter.set()
    with anyio.CancelScope() as scope:
        scope.cancel()
        await waiter.wait()
        pytest.fail("a cancelled scope's checkpoint must raise")  # pragma: no cover
    assert scope.cancelled_caught
