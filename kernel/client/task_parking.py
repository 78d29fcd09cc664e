"""How a caller's task parks until woken, and checks for its cancellation: per backend.

A call (or a queued fan-out caller) waits for exactly one thing, its request's
decision, and exactly one task waits for it. :func:`task_waiter_factory`
returns, once per event loop, the cheapest public way its backend has to park
one task and wake it:

* asyncio: a ``Future`` of the running loop (``loop.create_future()``), awaited
  directly and woken with ``set_result``;
* trio: ``trio.lowlevel.wait_task_rescheduled``, woken with
  ``trio.lowlevel.reschedule``.

Both have the interface of the waiters the request map wakes (``set()``, and
``wait()`` returning an awaitable), so they stand where an ``anyio.Event``
would, at a fraction of its cost (no backend look-up per waiter, no waiter
list). :func:`cancellation_checkpoint` is the backend's own check for a pending
cancellation (trio's, without anyio's backend look-up per call; anyio's on
asyncio, the only public one there). Guarantees:

* ``set()`` is idempotent and never blocks; a ``wait()`` after it returns at
  once (without a checkpoint: a caller checks its request before waiting).
* ``wait()`` is cancellable by any anyio cancel scope; a cancelled wait loses
  nothing (a later ``set()`` is a no-op for it, a later ``wait()`` parks again).
* One task waits at a time (on trio a second concurrent ``wait()`` raises
  RuntimeError; on asyncio the cancellation of one would end both). Shared
  waits (several watchers of one request) use ``anyio.Event``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio.lowlevel
import sniffio

__all__ = ["TaskWaiter", "cancellation_checkpoint", "task_waiter_factory"]


class TaskWaiter(Protocol):
    """Parks one task until :meth:`set` (see the module docstring)."""

    def set(self) -> None: ...
    def wait(self) -> Awaitable[Any]: ...


class _FutureWaiter:
    """asyncio: one future of the running loop, replaced if a wait was cancelled."""

    __slots__ = ("_future", "_is_set", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._future = loop.create_future()
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
            future = self._future = self._loop.create_future()
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

        async def _park(self) -> None:
            if self._is_set:
                return
            if self._task is not None:
                raise RuntimeError("another task is already waiting on this waiter")
            self._task = current_task()
            await wait_task_rescheduled(self._abort)

        def wait(self) -> Awaitable[Any]:
            return self._park()

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
