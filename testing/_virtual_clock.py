"""Virtual clocks on both anyio backends: timeouts of minutes in milliseconds.

:class:`VirtualTimeEventLoop` and :func:`virtual_backend` -- trio's ``MockClock``
with autojump, and an asyncio loop whose clock jumps to the next timer whenever
no IO is ready. Use them as the ``anyio_backend`` fixture's params, or through
the pytest plugin (:mod:`ctlwire.testing.pytest_plugin`).

Heartbeats run on the event loop's clock, so on a virtual clock they are
virtual too; but each one still costs real work. On a virtual clock
``EngineHarness(heartbeat_interval="auto")`` (the plugin's default) therefore
beats every :data:`VIRTUAL_HEARTBEAT_INTERVAL` (virtual) seconds, which keeps a
600 s timeout to a few milliseconds of real time (at 0.25 s it is 2,400 beats per side).
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any

__all__ = [
    "VIRTUAL_HEARTBEAT_INTERVAL",
    "VirtualTimeEventLoop",
    "on_virtual_clock",
    "virtual_backend",
]

VIRTUAL_HEARTBEAT_INTERVAL = 5.0
"""Heartbeat interval (virtual seconds) of an :class:`EngineHarness` on a virtual
clock, when neither ``heartbeat_interval`` nor the client/engine kwargs set one."""


def on_virtual_clock() -> bool:
    """True inside an event loop that runs on a virtual clock
    (:class:`VirtualTimeEventLoop`, or trio with a ``MockClock``)."""
    from ctlwire.transports.task_waits import current_backend

    try:
        source = current_backend().clock_source
    except Exception:  # no event loop runs
        return False
    if isinstance(source, VirtualTimeEventLoop):
        return True
    try:
        from trio.testing import MockClock
    except ImportError:
        return False
    return isinstance(source, MockClock)


class VirtualTimeEventLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose clock jumps ahead to the next timer when no IO is ready.

    Like trio's ``MockClock(autojump_threshold=0)``: a 600 s timeout fires
    immediately once every task is blocked. Real IO is still polled (without
    waiting) before each jump; waiting with no timer pending blocks for real.
    """

    def __init__(self) -> None:
        super().__init__(selectors.DefaultSelector())
        self._virtual_now = 0.0
        selector = self._selector  # type: ignore[attr-defined]
        real_select = selector.select

        def select(timeout: float | None = None) -> list[Any]:
            if timeout is None:
                return list(real_select(None))
            ready = list(real_select(0))
            if not ready and timeout > 0:
                self._virtual_now += timeout
            return ready

        selector.select = select

    def time(self) -> float:
        return self._virtual_now


def virtual_backend(name: str) -> tuple[str, dict[str, Any]]:
    """An ``anyio_backend`` value running ``name`` ("asyncio" or "trio") on a fresh
    virtual clock. Use in a test module::

        @pytest.fixture(params=["asyncio", "trio"])
        def anyio_backend(request):
            return virtual_backend(request.param)
    """
    if name == "asyncio":
        return ("asyncio", {"loop_factory": VirtualTimeEventLoop})
    if name == "trio":
        from trio.testing import MockClock  # trio is a test dependency

        return ("trio", {"clock": MockClock(autojump_threshold=0)})
    raise ValueError(f"unknown anyio backend {name!r}")
