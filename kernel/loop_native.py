"""The running event loop's own clock, event and cancellation check, resolved once.

anyio's module-level functions (``anyio.current_time``,
``anyio.lowlevel.checkpoint_if_cancelled``) and ``anyio.Event`` look the backend
up through sniffio on every call, which costs more than what they do: the
client's hot path resolves the backend's own once, when it enters its loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

import anyio
import anyio.lowlevel
import sniffio

__all__ = ["TrioTaskWaiter", "checkpoint_if_cancelled", "event_loop_clock", "event_loop_waiter",
           "single_waiter_factory"]


def event_loop_clock() -> Callable[[], float]:
    """The running event loop's clock: what ``anyio.current_time()`` reads, without
    anyio's per-call backend lookup (a call reads the clock several times)."""
    library = sniffio.current_async_library()
    if library == "asyncio":
        import asyncio

        return asyncio.get_running_loop().time
    if library == "trio":
        import trio

        # what trio.current_time() returns (the run's clock's current_time), without
        # its two layers of lookups; a mock clock is read the same way
        return trio.lowlevel.current_clock().current_time
    return anyio.current_time  # pragma: no cover - another anyio backend


def checkpoint_if_cancelled() -> Callable[[], Awaitable[None]]:
    """``anyio.lowlevel.checkpoint_if_cancelled`` of the running backend, without the
    backend lookup (through sniffio) that anyio makes on every call."""
    try:
        from anyio._core._eventloop import get_async_backend

        return cast(Callable[[], Awaitable[None]],
                    get_async_backend().checkpoint_if_cancelled)
    except Exception:  # pragma: no cover - another anyio layout
        return anyio.lowlevel.checkpoint_if_cancelled


def event_loop_waiter() -> Callable[[], Any]:
    """The running event loop's own event (anyio's wraps it and adds a checkpoint).

    Not a bare future: cancelling a task that awaits a future cancels the future,
    which would take the answer away from the other watchers sharing it."""
    library = sniffio.current_async_library()
    if library == "asyncio":
        import asyncio

        return asyncio.Event
    if library == "trio":
        import trio

        return trio.Event
    return anyio.Event  # pragma: no cover - another anyio backend


class _FutureWaiter:
    """A waiter for one task (asyncio): ``set()`` resolves a future that ``wait()``
    returns to await (no coroutine frame, no list of waiters). Cancelling the
    task that awaits it cancels the future, so it is never shared; a wait after
    that awaits a fresh one."""

    __slots__ = ("_flag", "_future")

    def __init__(self, future: Any) -> None:
        self._future = future
        self._flag = False

    def set(self) -> None:
        self._flag = True
        if not self._future.done():
            self._future.set_result(None)

    def is_set(self) -> bool:
        return self._flag

    def wait(self) -> Any:
        future = self._future
        if future.cancelled():  # an earlier wait was cancelled
            future = self._future = future.get_loop().create_future()
            if self._flag:
                future.set_result(None)
        return future


class TrioTaskWaiter:
    """A waiter for one task (trio): the waiting task parks itself and ``set()``
    reschedules it, as ``trio.Event`` does for each of its tasks, without the set
    of tasks. A wait after ``set()`` is a checkpoint; a cancelled wait unparks."""

    __slots__ = ("_flag", "_task")
    #: ``trio.lowlevel``, set by :func:`single_waiter_factory` (trio is imported only
    #: when it runs)
    lowlevel: Any = None

    def __init__(self) -> None:
        self._flag = False
        self._task: Any = None

    def set(self) -> None:
        if not self._flag:
            self._flag = True
            self.wake()

    def is_set(self) -> bool:
        return self._flag

    async def wait(self) -> None:
        if self._flag:
            await self.lowlevel.checkpoint()
            return
        await self.park()

    @property
    def parked(self) -> bool:
        """True while a task is parked here."""
        return self._task is not None

    def wake(self) -> None:
        """Reschedule the parked task, if any, without setting the flag."""
        task, self._task = self._task, None
        if task is not None:
            self.lowlevel.reschedule(task)

    async def park(self) -> None:
        """Park the calling task until :meth:`wake` or :meth:`set` (or its cancellation),
        whatever the flag says."""
        lowlevel = self.lowlevel
        if self._task is not None:
            raise RuntimeError("a single-task waiter already has a waiting task")
        self._task = lowlevel.current_task()
        await lowlevel.wait_task_rescheduled(self.abort)

    def abort(self, _raise_cancel: Any) -> Any:
        """The parked task is being cancelled: it is no longer parked here (what
        ``trio.lowlevel.wait_task_rescheduled`` calls; a method, not a closure made
        per park)."""
        self._task = None
        return self.lowlevel.Abort.SUCCEEDED


def single_waiter_factory() -> Callable[[], Any]:
    """A new waiter (``set()``, ``await wait()``) of the running loop for a request
    only one task waits on: on asyncio a bare future behind ``set``/``wait``, on
    trio the task parked and rescheduled, else the loop's event
    (:func:`event_loop_waiter`)."""
    library = sniffio.current_async_library()
    if library == "asyncio":
        import asyncio

        create_future = asyncio.get_running_loop().create_future
        return lambda: _FutureWaiter(create_future())
    if library == "trio":
        import trio

        TrioTaskWaiter.lowlevel = trio.lowlevel
        return TrioTaskWaiter
    return event_loop_waiter()  # pragma: no cover - another anyio backend
