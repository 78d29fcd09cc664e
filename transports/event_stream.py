"""Receiving a transport's events from the anyio memory stream it buffers them in."""

from __future__ import annotations

import contextlib

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from ctlwire.transports.errors import TransportClosed
from ctlwire.transports.transport import TransportEvent

__all__ = ["receive_event", "receive_events"]


async def receive_event(stream: MemoryObjectReceiveStream[TransportEvent]) -> TransportEvent:
    """The next event, waiting for one; raises TransportClosed once the stream is closed."""
    try:
        return await stream.receive()
    except (anyio.EndOfStream, anyio.ClosedResourceError):
        raise TransportClosed("transport is closed") from None


async def receive_events(stream: MemoryObjectReceiveStream[TransportEvent],
                         limit: int) -> list[TransportEvent]:
    """The next event (waiting for one) and those buffered behind it, up to ``limit``, in
    order; raises TransportClosed only when not even the first can be had."""
    events = [await receive_event(stream)]
    with contextlib.suppress(anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
        while len(events) < limit:
            events.append(stream.receive_nowait())
    return events
