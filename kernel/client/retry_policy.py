"""When a failed call may be sent again, and how a fan-out's retried ranks merge in.

``ControlClient.call(..., retry=n)`` and ``fan_out(..., retry=n)`` retry only
failures that cannot run the work twice: :class:`~ctlwire.kernel.errors.NotDelivered`
always, :class:`~ctlwire.kernel.errors.OutcomeUnknown` only with an idempotency
key or for a method declared idempotent, an engine's "in progress" answer
(code 425) to a keyed request, and its :class:`~ctlwire.kernel.errors.Busy`
(429: refused before it ran). Before each retry the policy waits, within the
call's deadline, for the ranks to be live again (:meth:`RetryPolicy.before_retry`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import anyio

from ctlwire.kernel.client.liveness_monitor import LivenessMonitor
from ctlwire.kernel.core.fan_out_policy import Policy
from ctlwire.kernel.core.fan_out_result import FanOutResult
from ctlwire.kernel.errors import Busy, EngineDead, FanOutFailed, RemoteError

__all__ = ["RetryPolicy", "merge_retried"]

_IN_PROGRESS = 425


class RetryPolicy:
    """The retry rules of one client. ``closed()`` tells whether the client closed;
    :attr:`now` is its clock (the event loop's once it runs)."""

    def __init__(self, liveness: LivenessMonitor, counters: dict[str, int], *,
                 idempotent_methods: Collection[str], heartbeat_interval: float | None,
                 closed: Callable[[], bool]) -> None:
        self.liveness = liveness
        self.peers = liveness.peers
        self.counters = counters
        self.idempotent_methods = frozenset(idempotent_methods)
        self.heartbeat_interval = heartbeat_interval
        self.closed = closed
        self.now: Callable[[], float] = anyio.current_time

    def retryable(self, error: BaseException, method: str, key: str) -> bool:
        """May ``error`` be retried without risking a second run?"""
        if isinstance(error, EngineDead):
            return error.retry_safe or bool(key) or method in self.idempotent_methods
        return isinstance(error, Busy) or (isinstance(error, RemoteError)
                                           and error.code == _IN_PROGRESS)

    async def before_retry(self, ranks: Sequence[int], deadline: float) -> bool:
        """Wait (until ``deadline``) for ``ranks`` to be live again; False when time ran out."""
        self.counters["retries"] += 1
        while True:
            if self.now() >= deadline or self.closed():
                return False
            if all(self.peers.is_live(r) for r in ranks):
                # a short pause lets an InProgress run finish; it also paces retries
                await anyio.sleep(min(self.heartbeat_interval or 0.05, 0.05))
                return self.now() < deadline
            event = self.liveness.peer_changed
            with anyio.move_on_after(deadline - self.now()):
                await event.wait()


def merge_retried(result: FanOutResult, again: Sequence[int], more: FanOutResult,
                  method: str, pol: Policy) -> FanOutFailed | None:
    """Merge the outcomes of the ranks ``again`` (retried: ``more``) into ``result``;
    the FanOutFailed to raise when a rank still could not answer at all, else None."""
    for r in again:
        result.errors.pop(r, None)
    result.results.update(more.results)
    result.errors.update(more.errors)
    return (FanOutFailed(method, pol.value, result)
            if any(not isinstance(e, RemoteError) for e in result.errors.values())
            else None)
