"""The ``on_progress`` callbacks of a client's calls, and their dispatch.

A call or fan-out with ``on_progress=`` registers its callback here: by request
id (each attempt's request, once registered), or by method for a ``watching``
fan-out, which may share another caller's request; when a rank's heartbeat says
it is running a request of this client, :meth:`ProgressCallbacks.dispatch` calls
the callbacks of that request: a callback hears its own request only (a watcher:
every request of its method). A failing callback is logged and never breaks the receiver.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ctlwire.kernel.core.peer_table import Progress
from ctlwire.kernel.core.request_registry import RequestRegistry

__all__ = ["ProgressCallback", "ProgressCallbacks"]

log = logging.getLogger("ctlwire.client")
ProgressCallback = Callable[[int, Progress], Any]
"""``on_progress(rank, progress)``: what a rank's heartbeat says about the call's request."""


class ProgressCallbacks:
    """The callbacks of one client's calls in flight; see the module docstring."""

    __slots__ = ("by_id", "by_method")

    def __init__(self) -> None:
        self.by_id: dict[int, ProgressCallback] = {}
        self.by_method: dict[str, list[ProgressCallback]] = {}

    def __bool__(self) -> bool:
        return bool(self.by_id or self.by_method)

    def add_method(self, method: str, callback: ProgressCallback) -> None:
        self.by_method.setdefault(method, []).append(callback)

    def remove_method(self, method: str, callback: ProgressCallback) -> None:
        self.by_method[method].remove(callback)
        if not self.by_method[method]:
            del self.by_method[method]

    def dispatch(self, registry: RequestRegistry, rank: int, progress: Progress) -> None:
        """Call the progress callbacks of the request ``rank`` says it is running."""
        entry = registry.get(progress.request_id)
        if entry is None or not entry.is_open or rank not in entry.ranks:
            return
        callbacks = list(self.by_method.get(entry.method, ()))
        by_id = self.by_id.get(entry.id)
        if by_id is not None:
            callbacks.append(by_id)
        for callback in callbacks:
            try:
                callback(rank, progress)
            except Exception:  # a caller's callback must not break the receiver
                log.exception("ctlwire: progress callback failed")
