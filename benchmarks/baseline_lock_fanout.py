"""The fan-out baseline: the fixed SGLang fan-out communicator, on anyio (Lock + Event).

SGLang's ``FanOutCommunicator.queueing_call`` after its FIFO fix, written on
anyio so that it runs on the same backend as the ctlwire side: callers of one
method take an ``anyio.Lock`` (first come, first served); the holder sends the
request to every rank, creates an ``anyio.Event``, and waits until the replies
have been collected, one per rank (``handle_recv`` sets the event at the last
one); it then reads the values and releases the lock. Replies are matched to
the communicator, not to a call (SGLang dispatches by reply type), which is
correct only because one call is in flight per communicator.

It runs over :class:`~ctlwire.benchmarks.baseline_pyzmq.PyzmqUtilityClient`'s
ROUTER (the same ipc socket setup as ctlwire's, read with the FD technique)
and bare sync pyzmq engine processes. What it does not do (and ctlwire does): a timeout, failing the
waiters when an engine dies, per-rank typed errors, a fan-out policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio

from .baseline_pyzmq import PyzmqUtilityClient, RemoteCallError

__all__ = ["LockFanOutCommunicator"]


class LockFanOutCommunicator:
    """``await comm(payload)`` returns ``{rank: value}`` from every rank."""

    def __init__(self, client: PyzmqUtilityClient, method: str, ranks: Sequence[int]) -> None:
        self.client = client
        self.method = method
        self.ranks = tuple(ranks)
        self._lock = anyio.Lock()
        self._event: anyio.Event | None = None
        self._values: dict[int, Any] = {}
        self._errors: dict[int, str] = {}
        self._key = client.add_fan_in(self)

    async def __call__(self, *args: Any) -> dict[int, Any]:
        async with self._lock:
            frame = self.client.encode((self._key, self.method, args))
            self._values = {}
            self._errors = {}
            event = self._event = anyio.Event()
            send = self.client.send_nowait
            for rank in self.ranks:
                send(rank, frame)
            self.client.after_send()
            await event.wait()
            values, errors = self._values, self._errors
            self._event = None
        if errors:
            raise RemoteCallError(errors)
        return values

    def handle_recv(self, rank: int, ok: bool, value: Any) -> None:
        if ok:
            self._values[rank] = value
        else:
            self._errors[rank] = str(value)
        if self._event is not None and len(self._values) + len(self._errors) == len(self.ranks):
            self._event.set()
