"""The running event loop's backend: how a task waits, and the loop's clock, chosen once.

:func:`current_backend` is the one place in ctlwire that asks which async backend
runs. It returns a :class:`Backend`: one object, chosen when it is called inside the
loop, holding the cheapest public mechanism of that backend for each of

* :attr:`~Backend.new_waiter`: makes a :class:`TaskWaiter`, which one task parks on
  until :meth:`~TaskWaiter.set` (asyncio: a ``Future`` of the running loop, awaited
  directly; trio: ``trio.lowlevel.wait_task_rescheduled`` and ``reschedule``). It has
  the interface of the waiters the request map wakes (``set()``, ``wait()``) and
  stands where an ``anyio.Event`` would, without a backend look-up per waiter or a
  waiter list.
* :attr:`~Backend.fd_watch`: makes an :class:`FdWatch`, a wait until a file
  descriptor is readable that another task ends at once with
  :meth:`~FdWatch.interrupt` (asyncio: ``add_reader`` and a future; trio:
  ``trio.lowlevel.wait_readable`` in a ``trio.CancelScope``), where anyio's
  ``wait_readable`` needs a cancel scope around it.
* :attr:`~Backend.checkpoint_if_cancelled`: the backend's own check for a pending
  cancellation (trio's, without anyio's backend look-up per call; anyio's on
  asyncio, the only public one there).
* :attr:`~Backend.cancel_scope`: makes a cancel scope with no deadline, entered
  with ``with`` and ended with ``cancel()`` (trio: ``trio.CancelScope``, which
  anyio's scopes on trio are; asyncio: ``anyio.CancelScope``), without anyio's
  backend look-up and wrapper per scope.
* :attr:`~Backend.clock`: the loop's clock, the one ``anyio.current_time`` reads and
  anyio's cancel-scope deadlines use (a virtual clock included), read without a
  backend look-up; :attr:`~Backend.clock_source` is the object it belongs to (the
  asyncio loop, or trio's ``Clock``).

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
* A backend belongs to the loop (asyncio) or run (trio) it was chosen in.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Protocol

import anyio
import anyio.lowlevel
import sniffio

__all__ = ["Backend", "CancelScope", "FdWatch", "TaskWaiter", "current_backend"]


class TaskWaiter(Protocol):
    """Parks one task until :meth:`set` (see the module docstring)."""

    def set(self) -> None: ...
    def wait(self) -> Awaitable[Any]: ...


class CancelScope(Protocol):
    """A cancel scope with no deadline: entered with ``with``, ended by :meth:`cancel`."""

    def __enter__(self) -> Any: ...
    def __exit__(self, exc_type: type[BaseException] | None, exc_val: BaseException | None,
                 exc_tb: TracebackType | None) -> bool: ...
    def cancel(self) -> None: ...


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


@functools.cache
def _trio_waiter_class() -> Callable[[], TaskWaiter]:
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


class Backend:
    """The running loop's waits and clock (see the module docstring)."""

    __slots__ = ("cancel_scope", "checkpoint_if_cancelled", "clock", "clock_source", "fd_watch",
                 "new_waiter")

    def __init__(self, new_waiter: Callable[[], TaskWaiter], fd_watch: Callable[[int], FdWatch],
                 checkpoint_if_cancelled: Callable[[], Awaitable[None]],
                 clock: Callable[[], float], clock_source: object,
                 cancel_scope: Callable[[], CancelScope]) -> None:
        self.new_waiter = new_waiter
        self.fd_watch = fd_watch
        self.checkpoint_if_cancelled = checkpoint_if_cancelled
        self.clock = clock
        self.clock_source = clock_source
        self.cancel_scope = cancel_scope


def current_backend() -> Backend:
    """The :class:`Backend` of the running event loop (call it inside the loop)."""
    if sniffio.current_async_library() == "trio":
        import trio

        clock = trio.lowlevel.current_clock()
        return Backend(_trio_waiter_class(), _trio_watch_class(),
                       trio.lowlevel.checkpoint_if_cancelled, clock.current_time, clock,
                       trio.CancelScope)
    loop = asyncio.get_running_loop()
    return Backend(functools.partial(_FutureWaiter, loop), _ReaderWatch,
                   anyio.lowlevel.checkpoint_if_cancelled, loop.time, loop, anyio.CancelScope)
