"""Fencing tokens: :func:`new_fence`, the one minting function of the kernel.

A fencing token is strictly increasing within a process and time-based across
processes (microseconds since the epoch), so a controller that starts later
holds a larger token than the one it replaces, clocks permitting. Engines
refuse a token older than the highest they accepted. Both the
:class:`~ctlwire.kernel.client.control_client.ControlClient` (``fence=True``) and the
:class:`~ctlwire.kernel.operations.runner.OperationRunner` mint theirs here, so
tokens of the two are comparable.
"""

from __future__ import annotations

import threading
import time

__all__ = ["new_fence"]

_lock = threading.Lock()
_last_fence = 0


def new_fence() -> int:
    """A fencing token larger than every token this process minted before, and
    (time-based, microseconds) than tokens minted earlier by other processes."""
    global _last_fence
    with _lock:
        _last_fence = max(_last_fence + 1, time.time_ns() // 1000)
        return _last_fence
