"""What a fan-out returns: every rank's result or typed error, never only rank 0's,
and every rank it left out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ctlwire.kernel.core.fan_out_policy import Policy

__all__ = ["FanOutResult", "LeftOutReason", "RankOutcome"]

LeftOutReason = Literal["not admitted", "quarantined", "admission condition not met"]
"""Why a present rank is not admissible (the values of ``FanOutResult.left_out``)."""


@dataclass(frozen=True)
class RankOutcome:
    """One rank's row of :meth:`FanOutResult.table`.

    ``status``: ``"ok"`` (``value`` is its result), ``"error"`` (``error`` is its
    typed error), ``"pending"`` (no outcome: the policy was met without it, or time
    ran out) or ``"left out"`` (not addressed; ``reason`` says why, e.g.
    ``quarantined``, and ``error`` is its
    :class:`~ctlwire.kernel.errors.RankLeftOut`)."""

    rank: int
    status: Literal["ok", "error", "pending", "left out"]
    value: Any = None
    error: Exception | None = None
    reason: str = ""

    def __str__(self) -> str:
        if self.status == "ok":
            return f"rank {self.rank}: ok {self.value!r}"
        if self.status == "error":
            return f"rank {self.rank}: error {type(self.error).__name__}: {self.error}"
        if self.status == "left out":
            return f"rank {self.rank}: left out ({self.reason})"
        return f"rank {self.rank}: pending"


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


@dataclass
class FanOutResult:
    """Per-rank outcomes of one fan-out.

    ``results`` maps each rank that answered ok to its (freshly decoded) value;
    ``errors`` maps each rank that answered with an error or failed locally to
    a typed :class:`~ctlwire.kernel.errors.CtlwireError`; ``pending`` lists
    ranks with no outcome yet (the policy was met without them, or time ran out);
    ``left_out`` maps each present rank a fan-out without explicit ranks did not
    address to why (a :data:`LeftOutReason`), and ``left_out_errors`` each of
    them to its typed :class:`~ctlwire.kernel.errors.RankLeftOut`.
    ``admissible_only``: the caller asked for the admissible ranks only
    (``ranks="admissible"``), so the ranks left out are reported but do not
    count against :attr:`ok`. ``joined``: a watching caller joined a request in
    flight (False: this caller's own request).

    Judge it by :attr:`ok` (or :meth:`raise_for_errors`): a rank left out counts
    like a rank that failed. :attr:`failures` names every rank that counts
    against it with a typed error (:class:`~ctlwire.kernel.errors.RankLeftOut`
    for a rank left out), :meth:`table` has a row for every rank, left out or
    not, and :meth:`summary` says it in one line: a status page built from them
    loses no rank.
    """

    method: str
    request_id: int
    policy: Policy
    ranks: tuple[int, ...]
    results: dict[int, Any] = field(default_factory=dict)
    errors: dict[int, Exception] = field(default_factory=dict)
    pending: tuple[int, ...] = ()
    left_out: dict[int, str] = field(default_factory=dict)
    left_out_errors: dict[int, Exception] = field(default_factory=dict)
    admissible_only: bool = False
    joined: bool = False

    @property
    def ok(self) -> bool:
        """Every rank answered ok: none failed, none is pending and none was left
        out (a rank left out counts only when the caller did not ask for the
        admissible ranks only)."""
        return not self.errors and not self.pending and (
            self.admissible_only or not self.left_out)

    @property
    def failures(self) -> dict[int, Exception]:
        """Every rank that counts against :attr:`ok` (pending ones aside), in rank
        order, with its typed error: :attr:`errors`, and a
        :class:`~ctlwire.kernel.errors.RankLeftOut` for each rank left out
        (unless :attr:`admissible_only`)."""
        out: dict[int, Exception] = dict(self.errors)
        if not self.admissible_only:
            for rank, error in self.left_out_errors.items():
                out.setdefault(rank, error)
        return dict(sorted(out.items()))

    def table(self) -> list[RankOutcome]:
        """One row per rank, in rank order: every rank the fan-out addressed (ok,
        error or pending) and every rank it left out."""
        rows = []
        for rank in sorted({*self.ranks, *self.left_out}):
            if rank in self.results:
                rows.append(RankOutcome(rank, "ok", value=self.results[rank]))
            elif rank in self.errors:
                rows.append(RankOutcome(rank, "error", error=self.errors[rank]))
            elif rank in self.left_out:
                rows.append(RankOutcome(rank, "left out", error=self.left_out_errors.get(rank),
                                        reason=self.left_out[rank]))
            else:
                rows.append(RankOutcome(rank, "pending"))
        return rows

    def summary(self) -> str:
        """One line: the ranks that answered ok, failed (with the error's type),
        have no outcome and were left out (with why), e.g.
        ``get_server_info: 2 ok (ranks 0, 2); 1 left out (rank 1: quarantined)``
        (``... left out, admissible ranks only (...)`` when they do not count)."""
        ok = sorted(self.results)
        parts = [f"{len(ok)} ok" + (f" ({_ranks(ok)})" if ok else "")]
        if self.errors:
            parts.append(f"{len(self.errors)} failed (" + ", ".join(
                f"rank {r}: {type(e).__name__}" for r, e in sorted(self.errors.items())) + ")")
        if self.pending:
            parts.append(f"{len(self.pending)} pending ({_ranks(sorted(self.pending))})")
        if self.left_out:
            only = ", admissible ranks only" if self.admissible_only else ""
            parts.append(f"{len(self.left_out)} left out{only} (" + ", ".join(
                f"rank {r}: {why}" for r, why in sorted(self.left_out.items())) + ")")
        return f"{self.method}: " + "; ".join(parts)

    def value(self, rank: int) -> Any:
        """The result of ``rank``; raises its error, or KeyError when it has none."""
        if rank in self.results:
            return self.results[rank]
        if rank in self.errors:
            raise self.errors[rank]
        raise KeyError(f"rank {rank} has no outcome in {self.method!r} ({self.request_id})")

    def raise_for_errors(self) -> None:
        """Raise the error of the lowest rank in :attr:`failures`, if any (a rank
        left out raises :class:`~ctlwire.kernel.errors.RankLeftOut`)."""
        failures = self.failures
        if failures:
            raise failures[min(failures)]
