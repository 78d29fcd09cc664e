"""The running event loop's clock, resolved once through public APIs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import sniffio

__all__ = ["loop_clock"]


def loop_clock() -> Callable[[], float]:
    """The running event loop's clock: the one ``anyio.current_time`` reads and
    anyio's cancel-scope deadlines use (a virtual clock included), without asking
    which backend runs on every read. Call it inside the event loop."""
    if sniffio.current_async_library() == "trio":
        import trio

        # the run's clock itself (what trio.current_time() reads, a call shorter)
        return trio.lowlevel.current_clock().current_time
    return asyncio.get_running_loop().time
