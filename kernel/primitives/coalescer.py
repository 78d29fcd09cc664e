"""Concurrent callers share one call in flight: :class:`Coalescer` and :class:`SharedOutcome`.

::

    infos: Coalescer[SharedOutcome[dict]] = Coalescer(joins="any")

    async def server_info() -> dict:
        flight, started = infos.share("info", SharedOutcome)
        if started:
            sock.send(b"info?")        # your receive loop: infos.get("info").set_result(...)
        try:
            return await flight.wait(timeout=5.0)      # each caller its own copy
        finally:
            infos.done("info", flight)

Guarantees:

* **One call, many callers.** While a flight is open (undecided), a caller
  joins it instead of starting another: with ``joins="identical"`` only a
  caller of the same key, with ``joins="any"`` every concurrent caller.
  :meth:`Coalescer.share` tells each caller whether it started the flight.
* **A caller's departure is its own.** A joined caller that is cancelled or
  whose deadline passes leaves alone: the flight and the other callers' wait go
  on, the caller that started it included (its cancellation does not take the
  answer away from the others).
* **Nothing kept after the answer.** A decided flight is never joined; the
  last :meth:`Coalescer.done` of it forgets it. A flight nobody decides stays
  open, and joinable, until it is (deadlines bound each caller's wait).
* **Each caller its own copy** (:class:`SharedOutcome`: a deep copy by default).

The coalescer is synchronous and holds no loop: a
:class:`~ctlwire.kernel.client.control_client.ControlClient`'s watching fan-outs
and :class:`~ctlwire.kernel.primitives.own_io_fan_out.OwnIoFanOut` share their
requests through it (their flights are request-map entries), and the
interleaving explorer drives it with the request map through every
interleaving of joins, replies, deadlines and cancellations.
"""

from __future__ import annotations

import copy as copying
import math
from collections.abc import Callable, Hashable
from typing import Any, Generic, Literal, Protocol, TypeVar

import anyio

from ctlwire.kernel.errors import RequestTimedOut

__all__ = ["Coalescer", "InFlight", "Joins", "SharedOutcome"]

Joins = Literal["identical", "any"]
_JOINS = ("identical", "any")


class InFlight(Protocol):
    """What a coalescer shares: anything that says whether it is still undecided."""

    @property
    def is_open(self) -> bool: ...


F = TypeVar("F", bound=InFlight)
T = TypeVar("T")


def checked_joins(joins: Any) -> Joins:
    """``joins`` if it is ``"identical"`` or ``"any"``; ValueError otherwise."""
    if joins not in _JOINS:
        raise ValueError(f"joins must be 'identical' or 'any', not {joins!r}")
    joined: Joins = joins
    return joined


class Coalescer(Generic[F]):
    """The flights in progress, by key: a caller joins the open one instead of
    starting another, a caller's departure is its own, and a decided flight is
    never joined. ``joins`` is the default of :meth:`share` (``"identical"``:
    callers of the same key share, ``"any"``: every concurrent caller shares the
    latest flight)."""

    def __init__(self, joins: Joins = "identical") -> None:
        self.joins: Joins = checked_joins(joins)
        self._flights: dict[Hashable, F] = {}
        self._latest: F | None = None
        #: flights started, callers that joined one (monotonic)
        self.started_total = 0
        self.joined_total = 0

    @property
    def in_flight(self) -> int:
        """Open flights this coalescer knows."""
        return sum(1 for f in self._flights.values() if f.is_open)

    @property
    def tracked(self) -> int:
        """Flights this coalescer still holds: open ones, and decided ones no caller
        has called :meth:`done` for yet."""
        return len(self._flights)

    def get(self, key: Hashable, joins: Joins | None = None) -> F | None:
        """The open flight a caller of ``key`` would join (None: it would start one)."""
        flight = self._latest if (joins or self.joins) == "any" else self._flights.get(key)
        return flight if flight is not None and flight.is_open else None

    def share(self, key: Hashable, start: Callable[[], F],
              joins: Joins | None = None) -> tuple[F, bool]:
        """Join the open flight (see :meth:`get`), or make one with ``start()``;
        True when this caller started it. TypeError for an unhashable ``key``."""
        flight = self.get(key, joins)
        if flight is not None:
            self.joined_total += 1
            return flight, False
        flight = start()
        self._flights[key] = self._latest = flight
        self.started_total += 1
        return flight, True

    def done(self, key: Hashable, flight: F) -> None:
        """A caller of ``flight`` left: forget the flight once it is decided."""
        if flight.is_open:
            return
        if self._flights.get(key) is flight:
            del self._flights[key]
        if self._latest is flight:
            self._latest = None


class SharedOutcome(Generic[T]):
    """One outcome several tasks wait for, each with its own deadline.

    Decided once, by :meth:`set_result` or :meth:`set_exception` (later calls are
    ignored and return False), by whoever learns it (a receive loop, the caller
    that started it). Each waiter gets ``copy(value)`` (``copy=None``: the one
    object). Built anywhere; its event is made in the loop of the first waiter.
    """

    __slots__ = ("_error", "_event", "_value", "copy", "is_open", "name")

    def __init__(self, name: str = "shared call", *,
                 copy: Callable[[Any], Any] | None = copying.deepcopy) -> None:
        self.name = name
        self.copy = copy
        self.is_open = True
        self._value: Any = None
        self._error: BaseException | None = None
        self._event: anyio.Event | None = None

    def set_result(self, value: T) -> bool:
        """Decide it with ``value``; False when it was decided already."""
        return self._decide(value, None)

    def set_exception(self, error: BaseException) -> bool:
        """Decide it with ``error`` (each waiter raises it); False when decided already."""
        return self._decide(None, error)

    def _decide(self, value: Any, error: BaseException | None) -> bool:
        if not self.is_open:
            return False
        self.is_open = False
        self._value, self._error = value, error
        if self._event is not None:
            self._event.set()
        return True

    async def wait(self, timeout: float | None = None) -> T:
        """The outcome (this caller's copy), or its exception. Raises
        RequestTimedOut when ``timeout`` (seconds) passes first; the flight stays
        open for the others."""
        if self.is_open:
            if self._event is None:
                self._event = anyio.Event()
            with anyio.move_on_after(math.inf if timeout is None else timeout):
                await self._event.wait()
            if self.is_open:
                raise RequestTimedOut(self.name, math.inf if timeout is None else timeout)
        if self._error is not None:
            raise self._error
        value: T = self._value if self.copy is None else self.copy(self._value)
        return value

