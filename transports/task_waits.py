"""How a task waits, per backend: for a wake-up, for a readable fd, and for nothing if cancelled.

Three waits on the hot paths, each the cheapest public mechanism of the running
backend, resolved once (this is the one module that asks which backend runs):

* :func:`task_waiter_factory`: a waiter one task parks on until :meth:`set`
  (asyncio: a ``Future`` of the running loop, awaited directly; trio:
  ``trio.lowlevel.wait_task_rescheduled`` and ``reschedule``). It has the
  interface of the waiters the request map wakes (``set()``, ``wait()``) and
  stands where an ``anyio.Event`` would, without a backend look-up per waiter
  or a waiter list.
* :func:`fd_watch`: a wait until a file descriptor is readable that another
  task ends at once with :meth:`FdWatch.interrupt` (asyncio: ``add_reader``
  and a future; trio: ``trio.lowlevel.wait_readable`` in a ``trio.CancelScope``),
  where anyio's ``wait_readable`` needs a cancel scope around it.
* :func:`cancellation_checkpoint`: the backend's own check for a pending
  cancellation (trio's, without anyio's backend look-up per call; anyio's on
  asyncio, the only public one there).

Guarantees:

* ``set()`` is idempotent and never blocks; a ``wait()`` after it returns at
  once (without a checkpoint: a caller checks its request before waiting).
* Every wait is cancellable by any anyio cancel scope and loses nothing when
  cancelled (a later ``set()`` is a no-op for it, a later ``wait()`` parks again;
  a cancelled fd watch leaves no reader registered).
* One task waits on a waiter or an fd watch at a time (on trio a second
  concurrent ``wait()`` of a waiter raises RuntimeError; on asyncio the
  cancellation of one would end both). Shared waits (several watchers of one
  request) use ``anyio.Event``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
import anyio.lowlevel
import sniffio

__all__ = ["FdWatch", "TaskWaiter", "cancellation_checkpoint", "fd_watch",
           "task_waiter_factory"]


class TaskWaiter(Protocol):
    """Parks one task until :meth:`set` (see the module docstring)."""

    def set(self) -> None: ...
    def wait(self) -> Awaitable[Any]: ...


class FdWatch(Protocol):
    """Waits until one fd is readable, or until interrupted (see the module docstring)."""

    async def wait(self) -> bool:
        """Until the fd is readable (True) or :meth:`interrupt` / :meth:`close` (False)."""

    def interrupt(self) -> None:
        """End a wait in progress (False); a no-op while none is."""

    def close(self) -> None:
        """The fd is about to be closed: end a wait in progress (False) and forget
        the fd before it can be reused."""


class _FutureWaiter:
    """asyncio: one future of the running loop (an ``asyncio.Future`` bound to it:
    what the default loop's ``create_future()`` makes, without that call), replaced
    if a wait was cancelled."""

    __slots__ = ("_future", "_is_set", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._future: asyncio.Future[None] = asyncio.Future(loop=loop)
        self._is_set = False

    def set(self) -> None:
        self._is_set = True
        future = self._future
        if not future.done():
            future.set_result(None)

    def wait(self) -> Awaitable[Any]:
        future = self._future
        if future.done():
            if self._is_set:
                return _SET
            # a cancelled wait took the future with it: park on a fresh one
            future = self._future = asyncio.Future(loop=self._loop)
        return future


class _Set:
    """An awaitable that is already done (a ``wait()`` after ``set()``)."""

    __slots__ = ()

    def __await__(self) -> Any:
        return None
        yield  # pragma: no cover - makes this a generator


_SET = _Set()


def _trio_factory() -> Callable[[], TaskWaiter]:
    from trio.lowlevel import Abort, current_task, reschedule, wait_task_rescheduled

    class _TrioWaiter:
        """trio: the parked task itself, rescheduled by :meth:`set`."""

        __slots__ = ("_is_set", "_task")

        def __init__(self) -> None:
            self._task: Any = None
            self._is_set = False

        def set(self) -> None:
            if self._is_set:
                return
            self._is_set = True
            task = self._task
            if task is not None:
                self._task = None
                reschedule(task)

        def _abort(self, _raise_cancel: Any) -> Abort:
            self._task = None
            return Abort.SUCCEEDED

        def wait(self) -> Awaitable[Any]:
            # the calling task parks when it awaits the result, at once (nothing
            # suspends between this call and that await)
            if self._is_set:
                return _SET
            if self._task is not None:
                raise RuntimeError("another task is already waiting on this waiter")
            self._task = current_task()
            return wait_task_rescheduled(self._abort)

    return _TrioWaiter


def task_waiter_factory() -> Callable[[], TaskWaiter]:
    """A maker of :class:`TaskWaiter` for the running event loop (call it inside
    the loop; the waiters it makes belong to that loop)."""
    if sniffio.current_async_library() == "trio":
        return _trio_factory()
    return functools.partial(_FutureWaiter, asyncio.get_running_loop())


def cancellation_checkpoint() -> Callable[[], Awaitable[None]]:
    """The running backend's ``checkpoint_if_cancelled`` (raise the caller's pending
    cancellation, else return without yielding), resolved once: trio's own, or
    anyio's on asyncio (call it inside the loop)."""
    if sniffio.current_async_library() == "trio":
        from trio.lowlevel import checkpoint_if_cancelled

        return checkpoint_if_cancelled
    return anyio.lowlevel.checkpoint_if_cancelled


class _ReaderWatch:
    """asyncio: the fd's reader sets a future of the running loop."""

    __slots__ = ("_fd", "_future", "_loop")

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._future: asyncio.Future[bool] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # with a reader registered

    async def wait(self) -> bool:
        loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        self._future = future
        loop.add_reader(self._fd, _readable, future)
        try:
            return await future
        finally:
            self._future = None
            if self._loop is not None:
                self._loop = None
                loop.remove_reader(self._fd)

    def interrupt(self) -> None:
        future = self._future
        if future is not None and not future.done():
            future.set_result(False)

    def close(self) -> None:
        loop = self._loop
        if loop is not None:  # the reader goes now: the fd number may be reused at once
            self._loop = None
            loop.remove_reader(self._fd)
        self.interrupt()


def _readable(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(True)


@functools.cache
def _trio_watch_class() -> Callable[[int], FdWatch]:
    import trio

    class _TrioWatch:
        """trio: ``wait_readable`` inside a scope that :meth:`interrupt` cancels."""

        __slots__ = ("_fd", "_scope")

        def __init__(self, fd: int) -> None:
            self._fd = fd
            self._scope: trio.CancelScope | None = None

        async def wait(self) -> bool:
            scope = self._scope = trio.CancelScope()
            try:
                with scope:
                    await trio.lowlevel.wait_readable(self._fd)
                    return True
            except trio.ClosedResourceError:
                pass
            finally:
                self._scope = None
            return False

        def interrupt(self) -> None:
            scope = self._scope
            if scope is not None:
                scope.cancel()

        def close(self) -> None:
            if self._scope is not None:
                anyio.notify_closing(self._fd)

    return _TrioWatch


def fd_watch(fd: int) -> FdWatch:
    """An :class:`FdWatch` of ``fd`` for the running backend (call it inside the loop)."""
    if sniffio.current_async_library() == "trio":
        return _trio_watch_class()(fd)
    return _ReaderWatch(fd)
