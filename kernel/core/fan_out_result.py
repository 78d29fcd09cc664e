"""What a fan-out returns: every rank's result or typed error, never only rank 0's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ctlwire.kernel.core.fan_out_policy import Policy

__all__ = ["FanOutResult"]


@dataclass
class FanOutResult:
    """Per-rank outcomes of one fan-out.

    ``results`` maps each rank that answered ok to its (freshly decoded) value;
    ``errors`` maps each rank that answered with an error or failed locally to
    a typed :class:`~ctlwire.kernel.errors.CtlwireError`; ``pending`` lists
    ranks with no outcome yet (the policy was met without them, or time ran out);
    ``left_out`` maps each present rank a fan-out without explicit ranks did not
    address to why (``not admitted``, ``quarantined``, ``admission condition
    not met``).
    """

    method: str
    request_id: int
    policy: Policy
    ranks: tuple[int, ...]
    results: dict[int, Any] = field(default_factory=dict)
    errors: dict[int, Exception] = field(default_factory=dict)
    pending: tuple[int, ...] = ()
    left_out: dict[int, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every addressed rank answered ok."""
        return not self.errors and not self.pending

    def value(self, rank: int) -> Any:
        """The result of ``rank``; raises its error, or KeyError when it has none."""
        if rank in self.results:
            return self.results[rank]
        if rank in self.errors:
            raise self.errors[rank]
        raise KeyError(f"rank {rank} has no outcome in {self.method!r} ({self.request_id})")

    def raise_for_errors(self) -> None:
        """Raise the error of the lowest failing rank, if any."""
        if self.errors:
            raise self.errors[min(self.errors)]
