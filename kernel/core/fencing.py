"""Fencing tokens: the one place that mints them (:func:`new_fence`) and the one
place an engine decides whether a token is admitted and when its fence moves
(:class:`FenceGuard`, sans-IO, time passed in).

A fencing token (``Request.fence``) is **microseconds since the epoch**: strictly
increasing within a process and time-based across processes, so a controller that
starts later holds a larger token than the one it replaces, clocks permitting; 0
means unfenced. Both the
:class:`~ctlwire.kernel.client.control_client.ControlClient` (``fence=True``) and the
:class:`~ctlwire.kernel.operations.runner.OperationRunner` mint theirs here, so
tokens of the two are comparable. Its valid range on an engine is
``1 .. now + window``, where ``now`` is the engine's clock in microseconds and
``window`` (:attr:`FenceGuard.window`, seconds) allows for clock skew between hosts.

Guarantees:

* A token lower than the highest accepted one is :attr:`FenceVerdict.STALE`
  (the request is refused with ``Fenced``).
* A negative token, or one above ``now + window``, is
  :attr:`FenceVerdict.OUT_OF_RANGE` (refused with ``FenceOutOfRange``): a
  token from the far future, or in the wrong unit, can never be accepted, so
  it cannot lock every controller out.
* The fence moves only through :meth:`FenceGuard.accept`, which the engine
  calls once a request is fully validated (its method exists, its payload
  decodes) and only for a state-changing method; read-only methods neither
  check nor move it.
* Refusals are counted (:attr:`stale`, :attr:`out_of_range`).
"""

from __future__ import annotations

import enum
import threading
import time

__all__ = ["DEFAULT_FENCE_WINDOW", "FenceGuard", "FenceVerdict", "new_fence"]

_lock = threading.Lock()
_last_fence = 0


def new_fence() -> int:
    """A fencing token larger than every token this process minted before, and
    (time-based, microseconds) than tokens minted earlier by other processes."""
    global _last_fence
    with _lock:
        _last_fence = max(_last_fence + 1, time.time_ns() // 1000)
        return _last_fence

DEFAULT_FENCE_WINDOW = 300.0
"""How far (seconds) a token may lie ahead of the engine's clock: room for clock
skew between the controller's host and the engine's, and the longest an
unauthenticated peer could hold the fence ahead of legitimate controllers."""


class FenceVerdict(enum.Enum):
    ADMIT = "admit"
    STALE = "stale"
    OUT_OF_RANGE = "out_of_range"


class FenceGuard:
    """The highest accepted token and the admission rule; see the module docstring."""

    __slots__ = ("_window_us", "high", "out_of_range", "stale")

    def __init__(self, window: float = DEFAULT_FENCE_WINDOW) -> None:
        if not window >= 0:
            raise ValueError(f"fence window must be >= 0 seconds, not {window!r}")
        self._window_us = int(window * 1_000_000)
        self.high = 0
        self.stale = 0
        self.out_of_range = 0

    @property
    def window(self) -> float:
        """Seconds a token may lie ahead of the engine's clock."""
        return self._window_us / 1_000_000

    def limit(self, now: float) -> int:
        """The largest token admissible at ``now`` (seconds since the epoch)."""
        return int(now * 1_000_000) + self._window_us

    def verdict(self, fence: int, now: float) -> FenceVerdict:
        """Whether a request carrying ``fence`` (non-zero) may run at ``now``;
        counts a refusal. Moves nothing."""
        if fence < 0 or fence > self.limit(now):
            self.out_of_range += 1
            return FenceVerdict.OUT_OF_RANGE
        if fence < self.high:
            self.stale += 1
            return FenceVerdict.STALE
        return FenceVerdict.ADMIT

    def accept(self, fence: int) -> None:
        """A validated, state-changing request with an admitted ``fence`` runs."""
        if fence > self.high:
            self.high = fence
