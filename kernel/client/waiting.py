"""How a caller waits for its request's decision.

* :func:`waiter_of`: a request's waiter is made only when its caller has to
  wait for someone else to decide it: a caller that receives its own reply, or
  whose request was decided before it waited, makes none. It is the client's
  per-backend one-task waiter (:mod:`~ctlwire.transports.task_waits`); a
  request several callers wait for (watching mode) is registered with an
  ``anyio.Event`` instead.
* :class:`Receiver`: where a call waits (the client's
  :class:`~ctlwire.kernel.client.receiver.ClientReceiver`, which lets a caller
  waiting alone receive its reply itself).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio

from ctlwire.kernel.core.request_registry import PendingRequest

__all__ = ["Receiver", "waiter_of"]


def waiter_of(entry: PendingRequest, make: Callable[[], Any] = anyio.Event) -> Any:
    """``entry``'s waiter (``set()`` and ``wait()``), made by ``make`` on first use:
    a decision sets the waiter only if one exists, so a caller about to wait
    checks ``entry.is_open`` and calls this without an await in between."""
    waiter = entry.waiter
    if waiter is None:
        waiter = entry.waiter = make()
    return waiter


class Receiver(Protocol):
    """Where a call waits for its decision (the client's receiver)."""

    holder: PendingRequest | None  # the request whose caller receives now

    def wait(self, entry: PendingRequest) -> Awaitable[Any]: ...
    def decided(self, entry: PendingRequest) -> None: ...
