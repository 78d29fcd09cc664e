"""What is left of a cleaned request in the request map: its tombstone.

A late or duplicate reply to a cleaned request is told apart by its
:class:`Tomb`: the ranks the request addressed and those that answered. The
request map (:class:`~ctlwire.kernel.core.request_registry.RequestRegistry`)
keeps a bounded number of them, the oldest evicted first.
"""

from __future__ import annotations

__all__ = ["Tomb"]


class Tomb:
    """What is left of a cleaned request: the ranks it addressed and those that answered.

    ``answered`` only ever holds ranks of ``ranks``, so a tombstone's size is
    bounded by its request's fan-out whatever replies arrive later. A request
    every rank answered leaves no set of its own (made on first use)."""

    __slots__ = ("_answered", "ranks")

    def __init__(self, ranks: tuple[int, ...], answered: set[int] | None) -> None:
        self.ranks = ranks
        self._answered = answered  # None: every rank of ``ranks`` answered

    @property
    def answered(self) -> set[int]:
        answered = self._answered
        if answered is None:
            answered = self._answered = set(self.ranks)
        return answered
