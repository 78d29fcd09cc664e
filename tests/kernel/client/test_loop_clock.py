"""The client's clock is the event loop's own: the one anyio's deadlines use."""

from __future__ import annotations

import time

import anyio
import pytest

from ctlwire.kernel.client.loop_clock import loop_clock

pytestmark = pytest.mark.anyio


async def test_the_loop_clock_reads_what_anyio_reads() -> None:
    clock = loop_clock()
    before = anyio.current_time()
    now = clock()
    assert before <= now <= anyio.current_time()


@pytest.mark.ctlwire_virtual_clock
async def test_the_loop_clock_follows_a_virtual_clock() -> None:
    clock = loop_clock()
    start, wall = clock(), time.monotonic()
    await anyio.sleep(600)  # virtual: it jumps, the wall clock does not
    assert clock() - start >= 600 > time.monotonic() - wall
    assert clock() == anyio.current_time()
