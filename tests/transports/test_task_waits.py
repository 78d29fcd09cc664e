"""The running loop's backend: a one-task waiter and an fd watch (woken once, cancellable,
reusable) and the loop's own clock."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import anyio
import pytest

from ctlwire.transports.task_waits import current_backend

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

GUARD = 10  # seconds: a hang guard only


async def test_a_waiting_task_is_woken_by_set() -> None:
    waiter = current_backend().new_waiter()
    woken: list[str] = []

    async def wait() -> None:
        await waiter.wait()
        woken.append("woken")

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            assert woken == []
            waiter.set()
            waiter.set()  # idempotent
    assert woken == ["woken"]


async def test_a_wait_after_set_returns_at_once() -> None:
    waiter = current_backend().new_waiter()
    waiter.set()
    with anyio.fail_after(GUARD):
        await waiter.wait()
        await waiter.wait()


async def test_a_cancelled_wait_loses_nothing_and_the_waiter_parks_again() -> None:
    waiter = current_backend().new_waiter()
    with anyio.move_on_after(0.01) as scope:
        await waiter.wait()
    assert scope.cancelled_caught
    woken: list[str] = []

    async def wait() -> None:
        await waiter.wait()  # parks again: not the cancellation of the first wait
        woken.append("woken")

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            assert woken == []
            waiter.set()
    assert woken == ["woken"]


async def test_a_cancel_scope_ends_a_wait_nobody_sets() -> None:
    waiter = current_backend().new_waiter()

    async def park() -> None:
        await waiter.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(park)
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    waiter.set()  # after the cancelled wait: a no-op, no error


async def test_the_backends_cancel_scope_ends_the_wait_inside_it_and_only_that() -> None:
    """``cancel()`` from another task ends the wait in the scope; the task goes on after
    it, and an enclosing anyio scope is untouched."""
    backend = current_backend()
    waiter = backend.new_waiter()
    scopes = []
    after: list[str] = []

    async def park() -> None:
        with anyio.CancelScope() as outer:
            with backend.cancel_scope() as scope:
                scopes.append(scope)
                await waiter.wait()
            after.append("after the scope")
        assert not outer.cancel_called
        after.append("done")

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(park)
            await anyio.wait_all_tasks_blocked()
            assert after == []
            scopes[0].cancel()
    assert after == ["after the scope", "done"]
    assert scopes[0].cancelled_caught


async def test_a_cancelled_enclosing_scope_reaches_through_the_backends_scope() -> None:
    backend = current_backend()
    reached: list[str] = []
    with anyio.fail_after(GUARD):
        with anyio.CancelScope() as outer:
            outer.cancel()
            with backend.cancel_scope():
                await anyio.sleep(GUARD)
                reached.append("not cancelled")
    assert reached == []
    assert outer.cancelled_caught


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_second_concurrent_wait_is_refused_on_trio() -> None:
    waiter = current_backend().new_waiter()

    async def park() -> None:
        await waiter.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(park)
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(RuntimeError, match="already waiting"):
            await waiter.wait()
        waiter.set()


# ---------------------------------------------------------------------- fd watch


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


async def test_an_fd_watch_returns_true_once_the_fd_is_readable(
        pair: tuple[socket.socket, socket.socket]) -> None:
    reader, writer = pair
    watch = current_backend().fd_watch(reader.fileno())
    results: list[bool] = []

    async def wait() -> None:
        results.append(await watch.wait())

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            assert results == []
            writer.send(b"x")
    assert results == [True]


async def test_an_interrupt_ends_the_wait_and_the_watch_waits_again(
        pair: tuple[socket.socket, socket.socket]) -> None:
    reader, writer = pair
    watch = current_backend().fd_watch(reader.fileno())
    results: list[bool] = []

    async def wait() -> None:
        results.append(await watch.wait())

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            watch.interrupt()
        assert results == [False]
        watch.interrupt()  # nobody waits: a no-op
        with anyio.move_on_after(0.01) as scope:  # cancelled by a scope: loses nothing
            await watch.wait()
        assert scope.cancelled_caught
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            writer.send(b"x")
    assert results == [False, True]


async def test_closing_the_watch_ends_a_wait_before_the_fd_closes(
        pair: tuple[socket.socket, socket.socket]) -> None:
    reader, _writer = pair
    watch = current_backend().fd_watch(reader.fileno())
    results: list[bool] = []

    async def wait() -> None:
        results.append(await watch.wait())

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            watch.close()
            reader.close()  # the event loop no longer watches it
    assert results == [False]


async def test_the_clock_reads_what_anyio_reads() -> None:
    clock = current_backend().clock
    before = anyio.current_time()
    now = clock()
    assert before <= now <= anyio.current_time()


@pytest.mark.ctlwire_virtual_clock
async def test_the_clock_follows_a_virtual_clock() -> None:
    clock = current_backend().clock
    start, wall = clock(), time.monotonic()
    await anyio.sleep(600)  # virtual: it jumps, the wall clock does not
    assert clock() - start >= 600 > time.monotonic() - wall
    assert clock() == anyio.current_time()
