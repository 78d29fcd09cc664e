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

__all__ = ["checkpoint_if_cancelled", "event_loop_clock", "event_loop_waiter",
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
    task that awaits it cancels the future, so it is never shared."""

    __slots__ = ("_future",)

    def __init__(self, future: Any) -> None:
        self._future = future

    def set(self) -> None:
        if not self._future.done():
            self._future.set_result(None)

    def is_set(self) -> bool:
        return bool(self._future.done())

    def wait(self) -> Any:
        return self._future


def single_waiter_factory() -> Callable[[], Any]:
    """A new waiter (``set()``, ``await wait()``) of the running loop for a request
    only one task waits on: on asyncio a bare future behind ``set``/``wait``,
    else the loop's event (:func:`event_loop_waiter`)."""
    if sniffio.current_async_library() == "asyncio":
        import asyncio

        create_future = asyncio.get_running_loop().create_future
        return lambda: _FutureWaiter(create_future())
    return event_loop_waiter()
