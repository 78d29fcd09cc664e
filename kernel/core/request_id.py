"""Request ids that are never reused: a per-process incarnation plus a counter.

An id is ``incarnation << 32 | counter`` (a positive int64). The incarnation is
random per allocator, so a reply meant for an earlier client process is
recognised as never issued here; the counter only grows.
"""

from __future__ import annotations

import secrets

__all__ = ["RequestIdAllocator"]

_COUNTER_BITS = 32
_COUNTER_MASK = (1 << _COUNTER_BITS) - 1


def _new_incarnation() -> int:
    return secrets.randbits(30) | (1 << 30)


class RequestIdAllocator:
    """Allocates ids; answers whether an id was ever issued, in O(1)."""

    __slots__ = ("_counter", "_retired", "incarnation")

    def __init__(self, incarnation: int | None = None) -> None:
        if incarnation is not None and not 0 < incarnation < (1 << 31):
            raise ValueError("incarnation must be in [1, 2**31)")
        self.incarnation = incarnation if incarnation is not None else _new_incarnation()
        self._counter = 0
        self._retired: dict[int, int] = {}

    def next(self) -> int:
        if self._counter == _COUNTER_MASK:  # pragma: no cover - 4e9 requests
            self._retired[self.incarnation] = self._counter
            fresh = _new_incarnation()
            while fresh == self.incarnation or fresh in self._retired:
                fresh = _new_incarnation()
            self.incarnation = fresh
            self._counter = 0
        self._counter += 1
        return (self.incarnation << _COUNTER_BITS) | self._counter

    def issued(self, request_id: int) -> bool:
        """Whether this allocator ever returned ``request_id``."""
        inc, counter = request_id >> _COUNTER_BITS, request_id & _COUNTER_MASK
        if counter == 0:
            return False
        if inc == self.incarnation:
            return counter <= self._counter
        last = self._retired.get(inc)
        return last is not None and counter <= last
